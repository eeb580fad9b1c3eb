"""The training loop: a run is checked, its state resumed or started (from scratch or a warm start), then it steps,
with validation, logging and checkpoints as scheduled. Its other concerns live apart: `preflight` (the checks before
anything is written), `resume` (which checkpoint a rerun continues from), `rollback` (NaN/Inf and divergence),
`evaluator` (validation loss), `signals` (preemption), `profiler` and `progress` (what a run says)."""

import contextlib
import dataclasses
import functools

import jax

from freeatten_jax import data
from freeatten_jax.errors import UserError
from freeatten_jax.nn import sharding
from freeatten_jax.training import (
    config,
    distributed,
    evaluator,
    integrity,
    lock,
    optim,
    preflight,
    profiler,
    progress,
    resume,
    rollback,
    signals,
    storage,
    wandb_log,
    warm_start,
)
from freeatten_jax.training import state as train_state
from freeatten_jax.training import step as train_step
from freeatten_jax.training.checkpoint import Checkpointer
from freeatten_jax.training.metrics import MetricsWriter


class RunMetrics(list):
    """The metrics rows written by a run; `preempted`: it stopped on SIGTERM/SIGINT after saving (a rerun resumes)."""

    preempted = False


def train_and_evaluate(
    cfg_dict, workdir, cluster: distributed.Cluster | None = None, *, initialise_only: bool = False
) -> RunMetrics:
    """Trains (resuming from WORKDIR's newest good checkpoint if any); returns the metrics written this run.

    `cfg_dict` is the command line's ConfigDict. Every field, the workdir, the data and a warm start's source are
    checked before anything is written. Process 0 holds WORKDIR/lock for the run: a second trainer on the same workdir
    stops at once. initialise_only: write the initial state (a warm start's checkpoint 0) and stop (freeatten-import).
    """
    with signals.stopping() as stop:  # before anything that takes time: a signal in start-up stops it, exit 75
        distributed.initialize_distributed(cluster=cluster)
        stop.take_back()  # from jax's preemption notifier, which a multi-process start installs
        watch = distributed.PeerWatch((cluster or distributed.Cluster()).peer_timeout_s) if jax.process_count() > 1 else None
        failed = True  # until the run returns: the peers must not wait for this process in a collective
        try:
            metrics = _checked_and_trained(cfg_dict, workdir, initialise_only, stop)
            failed = False
            return metrics
        except signals.StoppedStarting as e:
            failed = False
            progress.log(f"{e} during start-up: stopped before training, nothing to save; rerun the same command to resume")
            stopped = RunMetrics()
            stopped.preempted = True
            return stopped
        finally:
            if watch is not None:
                watch.stop(failed)


@dataclasses.dataclass(frozen=True)
class _Run:
    """A checked run's parts, built once before anything is written."""

    cfg: config.Config
    workdir: object
    mesh: jax.sharding.Mesh
    splits: data.Splits
    watch: data.FileWatch  # the training files as read: a change stops the run
    tx: object  # the optimizer
    abstract: dict  # the train state's shapes, dtypes and shardings
    shardings: dict
    source: warm_start.Source | None  # a warm start's, checked (None: from scratch, or resuming one)


def _checked_and_trained(cfg_dict, workdir, initialise_only: bool, stop: signals.StopSignal) -> RunMetrics:
    cfg = config.parse(cfg_dict)
    storage.check_workdir(workdir)
    mesh = preflight.make_mesh(cfg)
    watch = data.FileWatch(data.files(cfg.data))  # before the data is read: a change while it is read counts
    splits = data.load_splits(cfg.data)
    preflight.check_data(cfg, splits)
    tx = optim.make(cfg.optim, cfg.train.steps)
    abstract, shardings = train_state.abstract_state(cfg, mesh, tx)
    warm = cfg.init.path and not warm_start.has_checkpoint(workdir)
    source = warm_start.checked_source(cfg, splits.tokenizer) if warm else None
    storage.check_free_space(workdir, sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract)))
    run = _Run(cfg, workdir, mesh, splits, watch, tx, abstract, shardings, source)
    stop.check()
    with lock.hold(workdir):
        try:
            return _train(run, initialise_only, stop)
        except OSError as e:
            if isinstance(e, UserError) or e.errno not in storage.FULL_OR_READ_ONLY:
                raise
            raise storage.StorageError(
                f"cannot write to {workdir}: {e.strerror} ({e.filename or 'a file in it'}); stopped; "
                f"the checkpoints in it are kept: free space or fix the storage, then rerun"
            ) from e


def _train(run: _Run, initialise_only: bool, stop: signals.StopSignal) -> RunMetrics:
    """Resumes or starts the state (a warm start saves its start as checkpoint 0), then runs the loop; a signal before
    the first step stops it at the check after the resume or the one before the loop."""
    cfg = run.cfg
    block, blocks = distributed.data_shard(run.mesh, cfg.mesh.rules)  # processes holding the same rows read the same
    train_iter = data.train_iterator(
        run.splits.train,
        cfg.train.seq_len,
        cfg.train.batch_size // blocks,
        seed=cfg.train.seed,
        process_index=block,
        process_count=blocks,
        num_workers=cfg.data.num_workers,
        mix=data.retrieval_mix(cfg.data, run.splits.tokenizer, cfg.train.seq_len, cfg.train.seed),
        windows=data.synthetic_windows(cfg.data, cfg.train.seq_len, cfg.train.seed),
    )
    ckpt = Checkpointer(run.workdir, cfg.checkpoint, data_files=integrity.files(data.files(cfg.data)))
    try:
        state, start = resume.resume(ckpt, run.abstract, train_iter, cfg, run.workdir)
        stop.check()
        if jax.process_index() == 0:
            data.save_to_run(run.splits.tokenizer, storage.path(run.workdir))  # the run carries its tokenizer
        if state is None:
            state = train_state.create(cfg, run.mesh, run.tx, run.shardings)
            if cfg.init.path:  # a warm start: its state is checkpoint 0, so that it resumes without its source
                source = run.source or warm_start.checked_source(cfg, run.splits.tokenizer)
                state = warm_start.apply(cfg, state, source, run.workdir)
                rollback.save(ckpt, run.watch, 0, state, train_iter, cfg.source)
                ckpt.wait()  # durable before step 1: a run killed from here on resumes without its source
    except BaseException:
        ckpt.close()
        raise
    if initialise_only:
        ckpt.close()
        return RunMetrics()
    writer = MetricsWriter(run.workdir, start, cfg.source, functools.partial(wandb_log.sinks, run.workdir, cfg.train, cfg.source))
    try:
        loop = _Loop(run, ckpt, train_iter, writer, stop, start)
        stop.check()
        stop.until = "after this step"
        with sharding.use_mesh(run.mesh, cfg.mesh.rules):
            return loop(state, start)
    finally:
        with contextlib.ExitStack() as cleanup:  # each runs even if one raises (a failed save does, again)
            cleanup.callback(getattr(train_iter, "close", lambda: None))
            cleanup.callback(writer.close)
            cleanup.callback(ckpt.close)


class _Loop:
    """The steps of a run, and after each the bookkeeping its schedule asks for."""

    def __init__(self, run: _Run, ckpt: Checkpointer, train_iter, writer: MetricsWriter, stop: signals.StopSignal, start: int):
        self.run, self.t, self.ckpt, self.train_iter, self.writer, self.stop = run, run.cfg.train, ckpt, train_iter, writer, stop
        self.step_fn = train_step.make_train_step(run.cfg, run.shardings)
        self.evaluate = evaluator.Evaluator(run.cfg, run.splits, run.mesh)
        self.guard = rollback.Guard(self.t, ckpt, rollback.logged_losses(writer), start)
        self.throughput = progress.Throughput(run.cfg, run.mesh.devices.size, start)
        self.profiler = profiler.Profiler(self.t.profile_steps, run.workdir)
        self.written = RunMetrics()

    def __call__(self, state, start: int) -> RunMetrics:
        t, log = self.t, progress.log
        if start >= t.steps:
            log(f"already trained to step {start} of {t.steps}: nothing to do")
            return self.written
        for line in progress.start_lines(self.run.cfg, self.run.mesh, start):
            log(line)
        pending = None  # (step, metrics) of a step whose bookkeeping needs no state: checked one step late
        for step in range(start + 1, t.steps + 1):
            self.ckpt.check_for_errors()  # a background save that failed stops the run before its next step
            tokens = distributed.host_local_batch_to_global(next(self.train_iter), self.run.mesh, self.run.cfg.mesh.rules)
            self.run.watch.check()  # a data file that changed stops the run (at the latest before the next checkpoint)
            self.profiler.before(step)
            state, metrics = self.step_fn(state, tokens)
            self.profiler.after(step, metrics)
            if step == start + 1:  # exclude compilation from the rates; say how long it took
                jax.block_until_ready(metrics)
                self.throughput.restart(step)
                loss, took = float(metrics["loss"]), self.throughput.elapsed()
                log(f"step {step}/{t.steps} | loss {loss:.4f} | first step in {took:.1f} s (compilation included)")
            if pending is not None:
                self._finish(*pending, None)
            stopping = self.stop.any_process()
            pending = (step, metrics)
            if _evaluates(t, step) or step % t.checkpoint_every == 0 or step == t.steps or stopping:
                self._finish(step, metrics, state)
                pending = None
            if stopping:
                self._stop(step, state)
                break
        self.profiler.after(t.steps, state)  # a window reaching past the last step ends here
        self.ckpt.wait()
        self.guard.close()
        return self.written

    def _finish(self, step: int, metrics, state) -> None:
        """Checks a step's metrics, then logs / validates / checkpoints as scheduled (state: after the step)."""
        t, metrics = self.t, jax.device_get(metrics)
        self.guard.check(step, metrics)
        row = {}
        if step % t.log_every == 0 or step == t.steps:
            row = {"loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]), "lr": float(metrics["lr"])}
            row.update(self.throughput.rates(step))
        if _evaluates(t, step):
            row["val_loss"] = self.evaluate(state)
        if row:
            row["elapsed_sec"] = self.throughput.elapsed()  # since this process started training (incl. compiling)
            self.writer.write(step, row)
            self.written.append({"step": step, **row})
            progress.log(progress.line(t, step, row, metrics["lr"]))
        if step % t.checkpoint_every == 0 or step == t.steps:
            rollback.save(self.ckpt, self.run.watch, step, state, self.train_iter, self.run.cfg.source)
            self.guard.saved(step)
        if row or step % t.checkpoint_every == 0:
            self.throughput.restart(step)

    def _stop(self, step: int, state) -> None:
        """At a signal: saves (unless this step just did), waits for the save, and says how to resume."""
        progress.log(f"{self.stop.name} at step {step}: saving a checkpoint, then stopping")
        if step % self.t.checkpoint_every and step != self.t.steps:
            rollback.save(self.ckpt, self.run.watch, step, state, self.train_iter, self.run.cfg.source)
        self.ckpt.wait()
        self.ckpt.check_for_errors()
        progress.log(f"stopped at step {step} by a signal, checkpoint saved; rerun the same command to resume")
        self.written.preempted = True


def _evaluates(t, step: int) -> bool:
    return bool((t.eval_every and step % t.eval_every == 0) or step == t.steps)
