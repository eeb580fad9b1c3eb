"""The training loop: resume, steps, validation, logging, checkpoints, profiling, preemption and NaN handling."""
import functools
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from freeatten_jax import data
from freeatten_jax.errors import ConfigError, UserError
from freeatten_jax.nn import sharding
from freeatten_jax.training import config, distributed, flops, lock, optim, state as train_state, step as train_step, storage
from freeatten_jax.training.checkpoint import Checkpointer, describe
from freeatten_jax.training.metrics import MetricsWriter


class NonFiniteLossError(UserError, FloatingPointError):
    """Training produced a NaN or Inf loss or gradient."""


def _check_vocab(cfg: config.Config, splits: data.Splits) -> None:
    if cfg.model.vocab_size < splits.vocab_size:
        raise ConfigError(f"config.model.vocab_size={cfg.model.vocab_size} is smaller than the data's "
                          f"vocabulary ({splits.vocab_size}); allowed: 0 (take the data's) or >= {splits.vocab_size}")


def _mesh_devices(shape):
    """A single process may use fewer devices than it has: all of them for a -1 in the shape, else the first ones."""
    if -1 in shape or jax.process_count() > 1:
        return jax.devices()
    return jax.devices()[: int(np.prod(shape))]


class _StopSignal:
    """Turns SIGTERM/SIGINT into a request to save and stop; a second SIGINT interrupts at once."""

    def __init__(self):
        self.requested = False
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        logging.warning("signal %d: saving a checkpoint, then stopping", signum)

    def any_process(self) -> bool:
        if jax.process_count() == 1:
            return self.requested
        return bool(multihost_utils.process_allgather(np.array(self.requested)).any())

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def _eta(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{seconds:02d}s"


class Evaluator:
    """Mean validation loss over the first `eval_windows` held-out windows of the training length."""

    def __init__(self, cfg, splits, mesh, eval_def):
        rules = cfg.mesh.rules
        windows_WL = data.eval_windows(splits.val, cfg.train.seq_len, cfg.train.eval_windows)
        batch = cfg.train.batch_size // cfg.train.grad_accum_steps  # a micro-batch: what fits in memory
        pad = -len(windows_WL) % batch
        self.tokens_NBL = np.concatenate([windows_WL, np.zeros((pad, windows_WL.shape[1]), np.int32)]).reshape(-1, batch, windows_WL.shape[1])
        self.weights_NB = np.concatenate([np.ones(len(windows_WL), np.float32), np.zeros(pad, np.float32)]).reshape(-1, batch)
        self.tokens_sharding = sharding.batch_sharding(mesh, rules, self.tokens_NBL.shape[1:])
        self.weights_sharding = sharding.logical_spec(("batch",), self.weights_NB.shape[1:], mesh, rules)
        self.weights_sharding = jax.sharding.NamedSharding(mesh, self.weights_sharding)
        self.step = jax.jit(train_step.eval_step, static_argnames=("graphdef", "eos_id"))  # inputs arrive placed
        self.graphdef, self.eos_id = eval_def, data.document_eos(cfg.data)

    def __call__(self, state) -> float:
        total = count = 0.0
        for tokens_BL, weights_B in zip(self.tokens_NBL, self.weights_NB):
            tokens = jax.make_array_from_callback(tokens_BL.shape, self.tokens_sharding, lambda i: tokens_BL[i])
            weights = jax.make_array_from_callback(weights_B.shape, self.weights_sharding, lambda i: weights_B[i])
            loss_sum, n = self.step(state, tokens, weights, graphdef=self.graphdef, eos_id=self.eos_id)
            total, count = total + float(loss_sum), count + float(n)
        return total / count


# Fields a resumed run must share with its checkpoint: the parameters' shapes and the data stream.
RESUME_FIXED = ("model.", "data.", "train.seq_len", "train.batch_size", "train.seed")


def _flat(d: dict, prefix: str = "") -> dict:
    items = {}
    for key, value in d.items():
        items.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return items


def _check_resumable(saved: dict, cfg: config.Config, step: int, workdir) -> None:
    """Refuses to resume when a field that shapes the state or the data stream changed since the checkpoint
    (a field the checkpoint lacks was added since: it had its default)."""
    old, new = _flat(saved), _flat(cfg.source)
    changed = [k for k in sorted(set(old) | set(new)) if k.startswith(RESUME_FIXED) and k in old and old[k] != new.get(k)]
    if changed:
        k = changed[0]
        raise ConfigError(f"config.{k} is {new.get(k)!r} but the checkpoint at step {step} in {workdir} used "
                          f"{old.get(k)!r} ({len(changed)} such field(s)); resume with the same value or use a new --workdir")


def _log(*args, **kwargs) -> None:
    if jax.process_index() == 0:
        print(*args, **{**kwargs, "flush": True})


def _resume(ckpt, abstract, train_iter, cfg, workdir):
    """(state, step) from the newest checkpoint that restores cleanly, else (None, 0); unreadable ones are moved aside."""
    unreadable = []
    for step in reversed(ckpt.all_steps()):
        try:
            _check_resumable(ckpt.config_json(step), cfg, step, workdir)
            state = ckpt.restore(step, abstract, train_iter)
        except UserError:
            raise
        except Exception as e:  # truncated, missing or garbage files: orbax, tensorstore and json raise many types
            unreadable.append((step, describe(e), ckpt.quarantine(step, "unreadable")))
            continue
        for bad, reason, moved in unreadable:
            _log(f"checkpoint {bad} is unreadable ({reason}); moved it to {moved}; continuing from step {step}")
        confirmed = ckpt.confirmed_step()
        verdict = "confirmed good" if confirmed is not None and step <= confirmed else "not yet confirmed: its next step has not run"
        _log(f"resumed from step {step} (checkpoint in {workdir}; {verdict})")
        return state, step
    for bad, reason, moved in unreadable:
        _log(f"checkpoint {bad} is unreadable ({reason}); moved it to {moved}; starting from scratch")
    return None, 0


def train_and_evaluate(cfg_dict, workdir) -> list[dict]:
    """Trains (resuming from WORKDIR's newest readable checkpoint if any); returns the metrics written this run.

    `cfg_dict` is the command line's ConfigDict; every field is checked before any data is read. Process 0
    holds WORKDIR/lock for the run: a second trainer on the same workdir stops at once.
    """
    distributed.initialize_distributed()
    cfg = config.parse(cfg_dict)
    with lock.hold(workdir):
        return _train(cfg, workdir)


def _train(cfg: config.Config, workdir) -> list[dict]:
    try:
        mesh = sharding.make_mesh(cfg.mesh.shape, _mesh_devices(cfg.mesh.shape))
    except ValueError as e:
        raise ConfigError(f"config.{e}") from None
    splits = data.load_splits(cfg.data)
    _check_vocab(cfg, splits)
    if jax.process_index() == 0:
        data.save_to_run(splits.tokenizer, storage.path(workdir))  # the run carries its tokenizer
    rules, steps = cfg.mesh.rules, cfg.train.steps
    hosts, batch = jax.process_count(), cfg.train.batch_size
    replicas = mesh.shape["data"] * mesh.shape["fsdp"]
    micro = batch // cfg.train.grad_accum_steps
    if batch % hosts or micro % replicas:
        raise ConfigError(f"config.train.batch_size={batch} must be divisible by the {hosts} processes, and "
                          f"each of its {cfg.train.grad_accum_steps} micro-batches ({micro}) by the "
                          f"{replicas} data-parallel devices (mesh data x fsdp)")
    if (context := mesh.shape["context"]) > 1 and cfg.train.seq_len % (2 * context):
        raise ConfigError(f"config.train.seq_len={cfg.train.seq_len} must be a multiple of 2 x the mesh's context "
                          f"axis ({2 * context}): context parallelism splits the sequence into 2 chunks per device")
    train_iter = data.train_iterator(splits.train, cfg.train.seq_len, batch // hosts, seed=cfg.train.seed,
                                     process_index=jax.process_index(), process_count=hosts, num_workers=cfg.data.num_workers,
                                     mix=data.retrieval_mix(cfg.data, splits.tokenizer, cfg.train.seq_len, cfg.train.seed))
    ckpt = Checkpointer(workdir, cfg.checkpoint)
    tx = optim.make(cfg.optim, steps)
    abstract, state_shardings = train_state.abstract_state(cfg, mesh, tx)
    state, start = _resume(ckpt, abstract, train_iter, cfg, workdir)
    if state is None:
        state = train_state.create(cfg, mesh, tx, state_shardings)
    train_def, eval_def = train_state.graphdefs(cfg.model)
    step_fn = jax.jit(  # the state and the batch arrive placed; the new state keeps the shardings
        train_step.train_step,
        static_argnames=("graphdef", "tx", "schedule", "accum_steps", "eos_id"),
        out_shardings=(state_shardings, None),
        donate_argnums=0,
    )
    step_fn = functools.partial(step_fn, graphdef=train_def, tx=tx, schedule=optim.schedule(cfg.optim, steps),
                                accum_steps=cfg.train.grad_accum_steps, eos_id=data.document_eos(cfg.data))
    writer = MetricsWriter(workdir, start, cfg.source)
    stop = _StopSignal()
    try:
        with sharding.use_mesh(mesh, rules):
            evaluate = Evaluator(cfg, splits, mesh, eval_def)
            return _loop(cfg, state, start, step_fn, evaluate, train_iter, ckpt, writer, stop, mesh, workdir)
    finally:
        stop.restore()
        ckpt.wait()
        ckpt.close()
        writer.close()
        if hasattr(train_iter, "close"):
            train_iter.close()


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


def _loop(cfg, state, start, step_fn, evaluate, train_iter, ckpt, writer, stop, mesh, workdir):
    t = cfg.train
    tokens_per_step = t.batch_size * t.seq_len
    flops_per_token = flops.train_flops_per_token(cfg.model, t.seq_len)
    device = jax.devices()[0]
    peak = flops.peak_tflops(device.device_kind, t.peak_tflops)
    profiler = _Profiler(t.profile_steps, workdir)
    written = []
    timer = [start, time.perf_counter()]  # (step, time) rates are measured from
    began = timer[1]
    log = _log
    unconfirmed = [start or None]  # the newest checkpoint whose next step has not yet been seen finite
    if start >= t.steps:
        log(f"already trained to step {start} of {t.steps}: nothing to do", flush=True)
        return written
    log(f"training {cfg.model.attention} for steps {start + 1}..{t.steps}: {mesh.devices.size} devices, "
        f"mesh {dict(mesh.shape)}, batch {t.batch_size} x {t.seq_len} tokens", flush=True)
    if peak is None:
        log(f"MFU not reported: no known peak for device {device.device_kind!r}; set --config.train.peak_tflops", flush=True)

    def finish(step, metrics, state):
        """Checks a step's metrics, then logs / validates / checkpoints as scheduled (state: after the step)."""
        metrics = jax.device_get(metrics)
        if not metrics["finite"]:
            raise _non_finite(ckpt, step, f"loss {float(metrics['loss'])}, grad norm {float(metrics['grad_norm'])}", step - 1)
        if unconfirmed[0] == step - 1:
            ckpt.confirm(step - 1)
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
            _save(ckpt, step, state, train_iter, cfg.source)
            unconfirmed[0] = step
        if row or step % t.checkpoint_every == 0:
            timer[:] = step, time.perf_counter()

    pending = None  # (step, metrics) of a step whose bookkeeping needs no state: checked one step late
    for step in range(start + 1, t.steps + 1):
        tokens = distributed.host_local_batch_to_global(next(train_iter), mesh, cfg.mesh.rules)
        profiler.before(step)
        state, metrics = step_fn(state, tokens)
        profiler.after(step, metrics)
        if step == start + 1:  # exclude compilation from the rates
            jax.block_until_ready(metrics)
            timer[:] = step, time.perf_counter()
        if pending is not None:
            finish(*pending, None)
        stopping = stop.any_process()
        pending = (step, metrics)
        if _evaluates(t, step) or step % t.checkpoint_every == 0 or step == t.steps or stopping:
            finish(step, metrics, state)
            pending = None
        if stopping:
            if step % t.checkpoint_every and step != t.steps:
                _save(ckpt, step, state, train_iter, cfg.source)
            log(f"stopped at step {step}; rerun the same command to resume", flush=True)
            break
    profiler.after(t.steps, state)  # a window reaching past the last step ends here
    return written


@jax.jit
def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]))


def _save(ckpt, step: int, state, train_iter, source: dict) -> None:
    """Saves `state` unless a parameter is NaN or Inf (a finite step can still overflow the update)."""
    if not _all_finite(state["params"]):
        raise _non_finite(ckpt, step, "parameters after the update", step)
    ckpt.save(step, state, train_iter, source)


def _non_finite(ckpt, step: int, what: str, first_bad: int) -> NonFiniteLossError:
    """Moves checkpoints >= `first_bad` aside (the state the bad step came from, or later: unconfirmed) and
    says where a rerun starts."""
    ckpt.wait()
    moved = [s for s in ckpt.all_steps() if s >= first_bad]
    for s in moved:
        ckpt.quarantine(s, "non-finite")
    aside = f"moved unconfirmed checkpoint(s) {', '.join(map(str, moved))} to {ckpt.workdir / 'quarantine'}; " if moved else ""
    restart = ckpt.latest_step()
    return NonFiniteLossError(f"step {step}: {what}: not finite; stopped without saving; {aside}a rerun starts from "
                              + (f"checkpoint step {restart}" if restart is not None else "scratch (no good checkpoint)"))


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
