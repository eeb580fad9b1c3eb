"""Train a language model with any attention variant; rerunning the same command resumes.

    python train.py --config=configs/lssar.py:tiny --workdir=runs/lssar-tiny [--config.train.steps=200 ...]

Metrics go to WORKDIR/metrics.jsonl and WORKDIR/tensorboard; checkpoints to WORKDIR/checkpoints.
"""
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config, e.g. configs/lssar.py:tiny.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics (resumed if it has any).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax

    if not flags.FLAGS["verbosity"].present:  # library INFO logs (orbax) drown the progress lines
        logging.set_verbosity(logging.WARNING)
    from freeatten_jax import train_lib
    from freeatten_jax.config_check import ConfigError
    from freeatten_jax.data import CorpusError, DataError, ShardError, cache_root

    # Compiled programs are cached on disk, so resuming or rerunning a run starts faster.
    jax.config.update("jax_compilation_cache_dir", str(cache_root(_CONFIG.value.data.cache_dir) / "jax_compilation_cache"))
    try:
        train_lib.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    except (ConfigError, CorpusError, DataError, ShardError, train_lib.NonFiniteLossError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main)
