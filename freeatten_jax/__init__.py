"""freeatten_jax: length-extrapolating attention (softmax, SSMax, LSSA, LSSAR) for JAX and Flax NNX.

`freeatten_jax.load_run(workdir)` loads a trained run (needs the `train` extra; imported on first use, so
the core install keeps working without it). Importing it never changes jax's platform (the console scripts keep the
[compile] extra's plugins quiet on a host without chips: `quiet_plugins`).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name in ("load_run", "Run"):
        from freeatten_jax.training import run_dir

        return getattr(run_dir, name)
    raise AttributeError(f"module 'freeatten_jax' has no attribute {name!r}")
