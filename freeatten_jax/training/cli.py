"""`freeatten-train`: train a language model with any attention variant; rerunning the same command resumes.

    freeatten-train --config=lssar:tiny --workdir=runs/lssar-tiny [--config.train.steps=200 ...]

`--config` takes a packaged config by name (`lssar:tiny`) or a config file (`configs/lssar.py:tiny`).
Metrics go to WORKDIR/metrics.jsonl and WORKDIR/tensorboard; checkpoints to WORKDIR/checkpoints.
"""
import sys

from absl import flags
from ml_collections import config_flags

from freeatten_jax import cli


def main() -> None:
    argv = cli.config_argv(sys.argv)
    config = config_flags.DEFINE_config_file("config", None, "Experiment config, e.g. lssar:tiny or configs/lssar.py:tiny.",
                                             lock_config=True, sys_argv=argv)
    workdir = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics, local or gs:// (resumed if it has any).")
    flags.mark_flags_as_required(["config", "workdir"])

    def train(_):
        import jax

        from freeatten_jax.data import cache_root
        from freeatten_jax.training import loop

        # Compiled programs are cached on disk, so resuming or rerunning a run starts faster.
        cfg = cli.config_value(config)
        jax.config.update("jax_compilation_cache_dir", str(cache_root(cfg.data.cache_dir) / "jax_compilation_cache"))
        loop.train_and_evaluate(cfg, workdir.value)

    cli.run(train, argv)
