"""The training application (the only code that reads ml_collections): typed configs, state, the token loss,
step, loop, checkpoints, optimizer, metrics, and the freeatten-train / freeatten-generate commands."""
