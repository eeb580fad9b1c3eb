"""The training application: typed configs (the only code here that reads ml_collections), the train state, the token
loss and step, the loop and the rooms it calls (preflight, resume, rollback, evaluator, progress), checkpoints and their
integrity, warm starts, and a run on disk read back (run_dir: load_run). The commands live in freeatten_jax.cli."""
