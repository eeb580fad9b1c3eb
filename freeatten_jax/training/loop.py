"""The training loop: resume, steps, validation, logging, checkpoints, profiling, preemption and NaN handling."""

import contextlib
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from freeatten_jax import data
from freeatten_jax.errors import ConfigError, UserError
from freeatten_jax.nn import sharding
from freeatten_jax.training import config, distributed, divergence, flops, integrity, lock, optim, storage, warm_start
from freeatten_jax.training import state as train_state
from freeatten_jax.training import step as train_step
from freeatten_jax.training.checkpoint import (
    Checkpointer,
    CheckpointMismatchError,
    CheckpointUnavailableError,
    describe,
    is_unavailable,
)
from freeatten_jax.training.metrics import MetricsWriter


class NonFiniteLossError(UserError, FloatingPointError):
    """Training produced a NaN or Inf loss or gradient."""


class DivergenceError(UserError, FloatingPointError):
    """The loss stayed above the spike rule's threshold (training.divergence) for train.spike_steps steps."""


class NoUsableCheckpointError(UserError, RuntimeError):
    """Every checkpoint of a workdir was bad, and config.checkpoint.allow_fresh_start is off."""


def _mesh_devices(shape):
    """A single process may use fewer devices than it has: all of them for a -1 in the shape, else the first ones."""
    if -1 in shape or jax.process_count() > 1:
        return jax.devices()
    return jax.devices()[: int(np.prod(shape))]


class _StopSignal:
    """Turns SIGTERM/SIGINT into a request to save and stop; a second SIGINT interrupts at once. The loop says so:
    a handler that prints could interrupt another print."""

    def __init__(self):
        self.requested, self.name = False, "a signal to another process"
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested, self.name = True, signal.Signals(signum).name

    def any_process(self) -> bool:
        if jax.process_count() == 1:
            return self.requested
        return bool(multihost_utils.process_allgather(np.array(self.requested)).any())

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def _logged_losses(writer) -> list[float]:
    """The losses metrics.jsonl holds up to the resumed step (process 0's, sent to all: the spike rule must agree)."""
    losses = np.full(divergence.WINDOW, np.nan, np.float32)
    logged = [m["loss"] for m in writer.rows if "loss" in m][-divergence.WINDOW :]
    losses[: len(logged)] = logged
    if jax.process_count() > 1:
        losses = multihost_utils.broadcast_one_to_all(losses)
    return [float(x) for x in losses if np.isfinite(x)]


def _eta(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{seconds:02d}s"


class Evaluator:
    """Mean validation loss over the first `eval_windows` held-out windows of the training length."""

    def __init__(self, cfg, splits, mesh):
        rules = cfg.mesh.rules
        windows_WL = data.held_out_windows(cfg.data, splits, cfg.train.seq_len, cfg.train.eval_windows)
        batch = cfg.train.batch_size // cfg.train.grad_accum_steps  # a micro-batch: what fits in memory
        pad = -len(windows_WL) % batch
        self.tokens_NBL = np.concatenate([windows_WL, np.zeros((pad, windows_WL.shape[1]), np.int32)]).reshape(
            -1, batch, windows_WL.shape[1]
        )
        self.weights_NB = np.concatenate([np.ones(len(windows_WL), np.float32), np.zeros(pad, np.float32)]).reshape(-1, batch)
        self.tokens_sharding = sharding.batch_sharding(mesh, rules, self.tokens_NBL.shape[1:])
        self.weights_sharding = sharding.logical_spec(("batch",), self.weights_NB.shape[1:], mesh, rules)
        self.weights_sharding = jax.sharding.NamedSharding(mesh, self.weights_sharding)
        self.step = train_step.make_eval_step(cfg)

    def __call__(self, state) -> float:
        total = count = 0.0
        for tokens_BL, weights_B in zip(self.tokens_NBL, self.weights_NB):
            tokens = jax.make_array_from_callback(tokens_BL.shape, self.tokens_sharding, lambda i, x=tokens_BL: x[i])
            weights = jax.make_array_from_callback(weights_B.shape, self.weights_sharding, lambda i, x=weights_B: x[i])
            loss_sum, n = self.step(state, tokens, weights)
            total, count = total + float(loss_sum), count + float(n)
        return total / count


# Fields a resumed run must share with its checkpoint: the parameters' shapes and origin, and the data stream.
RESUME_FIXED = ("model.", "data.", "train.seq_len", "train.batch_size", "train.seed", "init.")
RESUME_FREE = ("data.allow_changed",)  # and, with data.allow_changed, the data's paths:
CHANGEABLE_DATA = ("data.path", "data.val_path")


def _flat(d: dict, prefix: str = "") -> dict:
    items = {}
    for key, value in d.items():
        items.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return items


def _check_resumable(saved: dict, cfg: config.Config, step: int, workdir) -> None:
    """Refuses to resume when a field that shapes the state or the data stream changed since the checkpoint
    (a field the checkpoint lacks was added since: it had its default)."""
    old, new = _flat(saved), _flat(cfg.source)
    free = RESUME_FREE + (CHANGEABLE_DATA if cfg.data.allow_changed else ())
    changed = [
        k
        for k in sorted(set(old) | set(new))
        if k.startswith(RESUME_FIXED) and k not in free and k in old and old[k] != new.get(k)
    ]
    if changed:
        k = changed[0]
        raise ConfigError(
            f"config.{k} is {new.get(k)!r} but the checkpoint at step {step} in {workdir} used "
            f"{old.get(k)!r} ({len(changed)} such field(s)); resume with the same value or use a new --workdir"
        )


def _log(*args, **kwargs) -> None:
    if jax.process_index() == 0:
        print(*args, **{**kwargs, "flush": True})


def _resume(ckpt, abstract, train_iter, cfg, workdir):
    """(state, step) from the newest checkpoint that restores and matches its fingerprints, else (None, 0).

    Provably bad checkpoints are moved aside; one that cannot be read (storage at fault) stops the run with nothing
    moved; when every checkpoint is bad, a start from scratch needs config.checkpoint.allow_fresh_start."""
    bad = []
    for step in reversed(ckpt.all_steps()):
        ckpt.check_readable(step)
        try:
            _check_resumable(ckpt.config_json(step), cfg, step, workdir)
            fingerprints = ckpt.fingerprints(step)
            if fingerprints is not None and not bad:
                _check_data_unchanged(fingerprints["data_files"], ckpt.data_files, cfg, step)
            state = ckpt.restore(step, abstract, train_iter, fingerprints)
        except UserError:
            raise
        except Exception as e:  # truncated, missing or garbage files: orbax, tensorstore and json raise many types
            if is_unavailable(e):
                raise CheckpointUnavailableError(
                    f"cannot read checkpoint step {step} in {ckpt.directory} ({describe(e)}); "
                    f"nothing was moved or written: fix the storage and rerun"
                ) from e
            reason = "fingerprint-mismatch" if isinstance(e, CheckpointMismatchError) else "unreadable"
            bad.append((step, reason, describe(e), ckpt.quarantine(step, reason)))
            continue
        for number, reason, error, moved in bad:
            _log(f"checkpoint {number} is {_BAD[reason]} ({error}); moved it to {moved}; continuing from step {step}")
        if fingerprints is None:
            _log(
                f"warning: checkpoint {step} has no fingerprints (an older version saved it): its arrays, data iterator "
                f"and data files are not checked; the next checkpoint will have them"
            )
        confirmed = ckpt.confirmed_step()
        verdict = (
            "confirmed good" if confirmed is not None and step <= confirmed else "not yet confirmed: its next step has not run"
        )
        _log(f"resumed from step {step} (checkpoint in {workdir}; {verdict})")
        return state, step
    for number, reason, error, moved in bad:
        _log(f"checkpoint {number} is {_BAD[reason]} ({error}); moved it to {moved}")
    quarantined = ckpt.workdir / "quarantine"
    if bad or (quarantined.exists() and any(quarantined.iterdir())):
        if not cfg.checkpoint.allow_fresh_start:
            raise NoUsableCheckpointError(
                f"no usable checkpoint in {ckpt.directory} (the bad ones are in {quarantined}); not "
                f"starting from scratch: rerun with --config.checkpoint.allow_fresh_start=True to train from step 0"
            )
        _log(f"no usable checkpoint in {ckpt.directory}; starting from scratch (config.checkpoint.allow_fresh_start)")
    return None, 0


_BAD = {"unreadable": "unreadable", "fingerprint-mismatch": "not what was saved: it does not match its fingerprints"}


def _check_data_unchanged(saved: list, now: list, cfg, step: int) -> None:
    if (change := integrity.files_changed(saved, now)) is None:
        return
    if not cfg.data.allow_changed:
        raise data.DataError(
            f"the training data changed since checkpoint step {step}: {change}; resume on the same data, "
            f"or pass --config.data.allow_changed=True to go on with this data"
        )
    _log(f"the training data changed since checkpoint step {step} ({change}); going on with it (config.data.allow_changed)")


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
    distributed.initialize_distributed(cluster=cluster)
    watch = distributed.PeerWatch((cluster or distributed.Cluster()).peer_timeout_s) if jax.process_count() > 1 else None
    failed = True  # until the run returns: the peers must not wait for this process in a collective
    try:
        metrics = _checked_and_trained(cfg_dict, workdir, initialise_only)
        failed = False
        return metrics
    finally:
        if watch is not None:
            watch.stop(failed)


def _checked_and_trained(cfg_dict, workdir, initialise_only: bool) -> RunMetrics:
    cfg = config.parse(cfg_dict)
    storage.check_workdir(workdir)
    try:
        mesh = sharding.make_mesh(cfg.mesh.shape, _mesh_devices(cfg.mesh.shape))
    except ValueError as e:
        raise ConfigError(f"config.{e}") from None
    _check_batch(cfg, mesh)
    watch = data.FileWatch(data.files(cfg.data))  # before the data is read: a change while it is read counts
    splits = data.load_splits(cfg.data)
    _check_data(cfg, splits)
    abstract, _ = train_state.abstract_state(cfg, mesh, optim.make(cfg.optim, cfg.train.steps))
    warm = cfg.init.path and not warm_start.has_checkpoint(workdir)
    source = warm_start.checked_source(cfg, splits.tokenizer) if warm else None
    storage.check_free_space(workdir, sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract)))
    with lock.hold(workdir):
        try:
            return _train(cfg, splits, watch, mesh, workdir, source, initialise_only)
        except OSError as e:
            if isinstance(e, UserError) or e.errno not in storage.FULL_OR_READ_ONLY:
                raise
            raise storage.StorageError(
                f"cannot write to {workdir}: {e.strerror} ({e.filename or 'a file in it'}); stopped; "
                f"the checkpoints in it are kept: free space or fix the storage, then rerun"
            ) from e


def _check_batch(cfg: config.Config, mesh) -> None:
    hosts, batch = jax.process_count(), cfg.train.batch_size
    replicas = mesh.shape["data"] * mesh.shape["fsdp"]
    micro = batch // cfg.train.grad_accum_steps
    if batch % hosts or micro % replicas:
        raise ConfigError(
            f"config.train.batch_size={batch} must be divisible by the {hosts} processes, and "
            f"each of its {cfg.train.grad_accum_steps} micro-batches ({micro}) by the "
            f"{replicas} data-parallel devices (mesh data x fsdp)"
        )
    if (context := mesh.shape["context"]) > 1 and cfg.train.seq_len % (2 * context):
        raise ConfigError(
            f"config.train.seq_len={cfg.train.seq_len} must be a multiple of 2 x the mesh's context "
            f"axis ({2 * context}): context parallelism splits the sequence into 2 chunks per device"
        )


def _check_data(cfg: config.Config, splits: data.Splits) -> None:
    """The vocabulary fits the model, and the data fills one training window per process and one validation window."""
    if cfg.model.vocab_size < splits.vocab_size:
        raise ConfigError(
            f"config.model.vocab_size={cfg.model.vocab_size} is smaller than the data's "
            f"vocabulary ({splits.vocab_size}); allowed: None (take the data's) or >= {splits.vocab_size}"
        )
    if data.synthetic_windows(cfg.data, cfg.train.seq_len, cfg.train.seed) is not None:
        return  # drawn per window: any number of them
    length = cfg.train.seq_len + 1
    if data.num_chunks(splits.train, length) < jax.process_count():
        tokens = sum(len(s) for s in splits.train)
        raise data.DataError(
            f"the training data has {tokens} tokens: too few for {jax.process_count()} window(s) of "
            f"config.train.seq_len + 1 = {length} tokens; lower train.seq_len or give more data"
        )
    if not sum(len(s) // length for s in splits.val):
        tokens = sum(len(s) for s in splits.val)
        raise data.DataError(
            f"the validation data has {tokens} tokens: too few for one window of config.train.seq_len + 1 = "
            f"{length} tokens; raise data.val_fraction, lower train.seq_len or give more data"
        )


def _train(cfg: config.Config, splits, watch, mesh, workdir, source, initialise_only: bool) -> RunMetrics:
    rules, steps, hosts = cfg.mesh.rules, cfg.train.steps, jax.process_count()
    train_iter = data.train_iterator(
        splits.train,
        cfg.train.seq_len,
        cfg.train.batch_size // hosts,
        seed=cfg.train.seed,
        process_index=jax.process_index(),
        process_count=hosts,
        num_workers=cfg.data.num_workers,
        mix=data.retrieval_mix(cfg.data, splits.tokenizer, cfg.train.seq_len, cfg.train.seed),
        windows=data.synthetic_windows(cfg.data, cfg.train.seq_len, cfg.train.seed),
    )
    ckpt = Checkpointer(workdir, cfg.checkpoint, data_files=integrity.files(data.files(cfg.data)))
    tx = optim.make(cfg.optim, steps)
    abstract, state_shardings = train_state.abstract_state(cfg, mesh, tx)
    try:
        state, start = _resume(ckpt, abstract, train_iter, cfg, workdir)
        if jax.process_index() == 0:
            data.save_to_run(splits.tokenizer, storage.path(workdir))  # the run carries its tokenizer
        if state is None:
            state = train_state.create(cfg, mesh, tx, state_shardings)
            if cfg.init.path:  # a warm start: its state is checkpoint 0, so that it resumes without its source
                state = warm_start.apply(cfg, state, source or warm_start.checked_source(cfg, splits.tokenizer), workdir)
                _save(ckpt, watch, 0, state, train_iter, cfg.source)
    except BaseException:
        ckpt.close()
        raise
    if initialise_only:
        ckpt.close()
        return RunMetrics()
    step_fn = train_step.make_train_step(cfg, state_shardings)
    writer = MetricsWriter(workdir, start, cfg.source)
    stop = _StopSignal()
    try:
        evaluate = Evaluator(cfg, splits, mesh)
        with sharding.use_mesh(mesh, rules):
            return _loop(cfg, state, start, step_fn, evaluate, train_iter, ckpt, watch, writer, stop, mesh, workdir)
    finally:
        stop.restore()
        with contextlib.ExitStack() as cleanup:  # each runs even if one raises (a failed save does, again)
            cleanup.callback(getattr(train_iter, "close", lambda: None))
            cleanup.callback(writer.close)
            cleanup.callback(ckpt.close)


class _Profiler:
    """A jax.profiler trace of steps [first, last] into WORKDIR/profile (TensorBoard's profile tab)."""

    def __init__(self, steps: tuple[int, ...], workdir):
        self.first, self.last = steps or (0, -1)
        self.dir, self.running = str(storage.path(workdir) / "profile"), False

    def before(self, step: int) -> None:
        if step == self.first:
            jax.profiler.start_trace(self.dir)
            self.running = True

    def after(self, step: int, outputs) -> None:
        if self.running and step >= self.last:
            jax.block_until_ready(outputs)
            jax.profiler.stop_trace()
            self.running = False


def _loop(cfg, state, start, step_fn, evaluate, train_iter, ckpt, watch, writer, stop, mesh, workdir):
    t = cfg.train
    tokens_per_step = t.batch_size * t.seq_len
    flops_per_token = flops.train_flops_per_token(cfg.model, t.seq_len)
    device = jax.devices()[0]
    peak = flops.peak_tflops(device.device_kind, t.peak_tflops)
    profiler = _Profiler(t.profile_steps, workdir)
    written = RunMetrics()
    spikes = divergence.SpikeRule(t.spike_factor, t.spike_steps, _logged_losses(writer))
    timer = [start, time.perf_counter()]  # (step, time) rates are measured from
    began = timer[1]
    log = _log
    unconfirmed = [start or None]  # the newest checkpoint whose next step has not yet been seen sound (finite, no spike)
    sound = [None]  # a checkpoint whose next step was sound: confirmed once it is wholly written
    if start >= t.steps:
        log(f"already trained to step {start} of {t.steps}: nothing to do", flush=True)
        return written
    log(
        f"training {cfg.model.attention} for steps {start + 1}..{t.steps}: {mesh.devices.size} devices, "
        f"mesh {dict(mesh.shape)}, batch {t.batch_size} x {t.seq_len} tokens",
        flush=True,
    )
    if peak is None:
        log(f"MFU not reported: no known peak for device {device.device_kind!r}; set --config.train.peak_tflops", flush=True)
    for warning in optim.warnings(cfg.optim, t.steps) + _logging_warnings(t):
        log(f"warning: {warning}", flush=True)

    def finish(step, metrics, state):
        """Checks a step's metrics, then logs / validates / checkpoints as scheduled (state: after the step)."""
        metrics = jax.device_get(metrics)
        if not metrics["finite"]:
            raise _rolled_back(
                NonFiniteLossError,
                ckpt,
                step - 1,
                f"step {step}: loss {float(metrics['loss'])}, grad norm {float(metrics['grad_norm'])}: not finite",
            )
        threshold = spikes.threshold()
        if spikes.observe(step, float(metrics["loss"])) and spikes.diverged:
            raise _rolled_back(
                DivergenceError,
                ckpt,
                spikes.first_spike - 1,
                f"step {step}: loss {float(metrics['loss']):.4g} has been above {t.spike_factor:g} x its running "
                f"median ({threshold / t.spike_factor:.4g}) for {spikes.run} steps (since step {spikes.first_spike}): "
                f"diverging",
                "lower optim.lr, or set train.spike_factor=0 to stop only on NaN/Inf",
            )
        if unconfirmed[0] is not None and unconfirmed[0] < step and spikes.run == 0:
            sound[0], unconfirmed[0] = unconfirmed[0], None
        if sound[0] is not None and not ckpt.saving():
            ckpt.confirm(sound[0])
            sound[0] = None
        row = {}
        if step % t.log_every == 0 or step == t.steps:
            row = {"loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]), "lr": float(metrics["lr"])}
            if step > timer[0]:
                row["tokens_per_sec"] = (step - timer[0]) * tokens_per_step / (time.perf_counter() - timer[1])
                row.update(flops.tflops_and_mfu(row["tokens_per_sec"], flops_per_token, mesh.devices.size, peak))
        if _evaluates(t, step):
            row["val_loss"] = evaluate(state)
        if row:
            row["elapsed_sec"] = time.perf_counter() - began  # since this process started training (incl. compiling)
            writer.write(step, row)
            written.append({"step": step, **row})
            log(_progress_line(t, step, row, metrics["lr"]), flush=True)
        if step % t.checkpoint_every == 0 or step == t.steps:
            _save(ckpt, watch, step, state, train_iter, cfg.source)
            unconfirmed[0] = step
        if row or step % t.checkpoint_every == 0:
            timer[:] = step, time.perf_counter()

    pending = None  # (step, metrics) of a step whose bookkeeping needs no state: checked one step late
    for step in range(start + 1, t.steps + 1):
        ckpt.check_for_errors()  # a background save that failed stops the run before its next step
        tokens = distributed.host_local_batch_to_global(next(train_iter), mesh, cfg.mesh.rules)
        watch.check()  # a data file that changed stops the run (at the latest before the next checkpoint)
        profiler.before(step)
        state, metrics = step_fn(state, tokens)
        profiler.after(step, metrics)
        if step == start + 1:  # exclude compilation from the rates; say how long it took
            jax.block_until_ready(metrics)
            timer[:] = step, time.perf_counter()
            log(
                f"step {step}/{t.steps} | loss {float(metrics['loss']):.4f} | first step in {timer[1] - began:.1f} s "
                f"(compilation included)",
                flush=True,
            )
        if pending is not None:
            finish(*pending, None)
        stopping = stop.any_process()
        pending = (step, metrics)
        if _evaluates(t, step) or step % t.checkpoint_every == 0 or step == t.steps or stopping:
            finish(step, metrics, state)
            pending = None
        if stopping:
            log(f"{stop.name} at step {step}: saving a checkpoint, then stopping", flush=True)
            if step % t.checkpoint_every and step != t.steps:
                _save(ckpt, watch, step, state, train_iter, cfg.source)
            ckpt.wait()
            ckpt.check_for_errors()
            log(f"stopped at step {step} by a signal, checkpoint saved; rerun the same command to resume", flush=True)
            written.preempted = True
            break
    profiler.after(t.steps, state)  # a window reaching past the last step ends here
    ckpt.wait()
    if sound[0] is not None:
        ckpt.confirm(sound[0])
    return written


@jax.jit
def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]))


def _save(ckpt, watch, step: int, state, train_iter, source: dict) -> None:
    """Saves `state` unless a parameter is NaN or Inf (a finite step can still overflow the update) or a data file
    changed since the run read it (its steps since the last checkpoint may have read the change)."""
    watch.check(force=True)
    if not _all_finite(state["params"]):
        raise _rolled_back(NonFiniteLossError, ckpt, step, f"step {step}: parameters after the update: not finite")
    ckpt.save(step, state, train_iter, source)


def _rolled_back(error_class, ckpt, first_bad: int, what: str, hint: str = ""):
    """Moves checkpoints >= `first_bad` aside (the state the bad step came from, or later: unconfirmed), so that
    a rerun resumes from the last good one; returns the error saying so."""
    ckpt.wait()
    moved = [s for s in ckpt.all_steps() if s >= first_bad]
    for s in moved:
        ckpt.quarantine(s, "non-finite" if error_class is NonFiniteLossError else "diverged")
    aside = f"moved unconfirmed checkpoint(s) {', '.join(map(str, moved))} to {ckpt.workdir / 'quarantine'}; " if moved else ""
    restart = ckpt.latest_step()
    where = (
        f"checkpoint step {restart}"
        if restart is not None
        else "scratch (no good checkpoint; needs config.checkpoint.allow_fresh_start)"
    )
    return error_class(f"{what}; stopped without saving; {aside}a rerun starts from {where}" + (f" ({hint})" if hint else ""))


def _logging_warnings(t) -> list[str]:
    """A log interval longer than the run leaves it silent until its last step: said once, before training."""
    if t.log_every <= t.steps:
        return []
    return [f"train.log_every={t.log_every} > train.steps={t.steps}: only the first and the last step are logged"]


def _evaluates(t, step: int) -> bool:
    return bool((t.eval_every and step % t.eval_every == 0) or step == t.steps)


def _progress_line(t, step: int, row: dict, lr: float) -> str:
    parts = [f"step {step}/{t.steps}"]
    parts += [f"{name} {row[key]:.4f}" for key, name in (("loss", "loss"), ("val_loss", "val")) if key in row]
    parts += [f"lr {lr:.2e}", f"elapsed {_eta(row['elapsed_sec'])}"]
    if "tokens_per_sec" in row:
        rate = row["tokens_per_sec"]
        parts += [f"{rate:,.0f} tok/s", f"{row['tflops_per_device']:.3g} TFLOP/s/device"]
        parts += [f"MFU {row['mfu']:.1%}"] if "mfu" in row else []
        parts += [f"ETA {_eta((t.steps - step) * t.batch_size * t.seq_len / rate)}"]
    return " | ".join(parts)
