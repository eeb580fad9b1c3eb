"""`freeatten-train`: train a language model with any attention variant; rerunning the same command resumes.

    freeatten-train --config=lssar:tiny --workdir=runs/lssar-tiny [--config.train.steps=200 ...]

`--config` takes the packaged experiment with named arguments (`lm:variant=lssar,size=tiny`, or `lssar:tiny` for
short) or a config file (`my_config.py:arg`); `--help` lists every config field with its default and allowed values.
Metrics go to WORKDIR/metrics.jsonl and WORKDIR/tensorboard; checkpoints to WORKDIR/checkpoints.
Several processes (one per host): `--coordinator_address=host0:1234 --num_processes=2 --process_id=0|1`
(left out on TPU pods, SLURM and MPI: detected). Exit codes: 0 done, 1 error, 75 stopped by SIGTERM/SIGINT
after saving, or during start-up before any step (rerun to resume), 76 another process died (restart them all to resume).
"""

import sys

from absl import flags
from ml_collections import config_flags

from freeatten_jax.cli import shared as cli
from freeatten_jax.errors import EXIT_PREEMPTED


def main() -> None:
    argv = cli.config_argv(sys.argv)
    config = config_flags.DEFINE_config_file(
        "config",
        None,
        "Experiment config, e.g. lm:variant=lssar,size=tiny, lssar:tiny or my_config.py:arg.",
        lock_config=True,
        sys_argv=argv,
    )
    workdir = flags.DEFINE_string(
        "workdir", None, "Directory for checkpoints and metrics, local or gs:// (resumed if it has any)."
    )
    coordinator = flags.DEFINE_string(
        "coordinator_address",
        None,
        "host:port of process 0 (multi-process runs; auto-detected on TPU pods, SLURM and MPI when left out).",
    )
    num_processes = flags.DEFINE_integer(
        "num_processes", None, "Processes in the run (with --coordinator_address).", lower_bound=1
    )
    process_id = flags.DEFINE_integer("process_id", None, "This process's index, 0 .. num_processes - 1.", lower_bound=0)
    peer_timeout = flags.DEFINE_integer(
        "peer_timeout", 60, "Seconds without news from another process before this one stops (exit 76).", lower_bound=1
    )
    flags.mark_flags_as_required(["config", "workdir"])

    def train(_):
        import jax

        from freeatten_jax.data import cache_root
        from freeatten_jax.training import distributed, loop

        cluster = distributed.Cluster(coordinator.value, num_processes.value, process_id.value, peer_timeout.value)
        # Compiled programs are cached on disk, so resuming or rerunning a run starts faster: in the user's cache
        # (JAX_COMPILATION_CACHE_DIR) if one is set, else beside the data cache.
        cfg = cli.config_value(config)
        if not jax.config.jax_compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", str(cache_root(cfg.data.cache_dir) / "jax_compilation_cache"))
        if loop.train_and_evaluate(cfg, workdir.value, cluster).preempted:
            sys.exit(EXIT_PREEMPTED)

    cli.run(train, argv)
