"""What a training run says: its log lines (process 0), the throughput of the steps since the last measurement, and
the one-line progress report of a logged step."""

import time

import jax

from freeatten_jax.training import flops, optim


def log(*args, **kwargs) -> None:
    if jax.process_index() == 0:
        print(*args, **{**kwargs, "flush": True})


def eta(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{seconds:02d}s"


class Throughput:
    """Tokens per second, TFLOP/s per device and MFU of the steps since `restart` was last called (compilation and
    checkpoint saves left out by restarting after them); `elapsed` counts from the run's start, compilation included."""

    def __init__(self, cfg, num_devices: int, step: int):
        t = cfg.train
        self.tokens_per_step, self.num_devices = t.batch_size * t.seq_len, num_devices
        self.flops_per_token = flops.train_flops_per_token(cfg.model, t.seq_len)
        self.device_kind = jax.devices()[0].device_kind
        self.peak = flops.peak_tflops(self.device_kind, t.peak_tflops)
        self.began = time.perf_counter()
        self.step, self.since = step, self.began

    def restart(self, step: int) -> None:
        self.step, self.since = step, time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.began

    def rates(self, step: int) -> dict:
        """{tokens_per_sec, tflops_per_device[, mfu]} over the steps since the last restart ({} if none ran)."""
        if step <= self.step:
            return {}
        tokens_per_sec = (step - self.step) * self.tokens_per_step / (time.perf_counter() - self.since)
        return {
            "tokens_per_sec": tokens_per_sec,
            **flops.tflops_and_mfu(tokens_per_sec, self.flops_per_token, self.num_devices, self.peak),
        }


def start_lines(cfg, mesh, start: int) -> list[str]:
    """What a run says before its first step: what it trains on what, and the warnings about its settings."""
    t = cfg.train
    lines = [
        f"training {cfg.model.attention} for steps {start + 1}..{t.steps}: {mesh.devices.size} devices, "
        f"mesh {dict(mesh.shape)}, batch {t.batch_size} x {t.seq_len} tokens"
    ]
    kind = jax.devices()[0].device_kind
    if flops.peak_tflops(kind, t.peak_tflops) is None:
        lines.append(f"MFU not reported: no known peak for device {kind!r}; set --config.train.peak_tflops")
    warnings = optim.warnings(cfg.optim, t.steps)
    if t.log_every > t.steps:  # a log interval longer than the run leaves it silent until its last step
        warnings.append(f"train.log_every={t.log_every} > train.steps={t.steps}: only the first and the last step are logged")
    return lines + [f"warning: {w}" for w in warnings]


def line(t, step: int, row: dict, lr: float) -> str:
    """The progress line of a logged step: its loss (and validation loss), lr, elapsed time, rates and ETA."""
    parts = [f"step {step}/{t.steps}"]
    parts += [f"{name} {row[key]:.4f}" for key, name in (("loss", "loss"), ("val_loss", "val")) if key in row]
    parts += [f"lr {lr:.2e}", f"elapsed {eta(row['elapsed_sec'])}"]
    if "tokens_per_sec" in row:
        rate = row["tokens_per_sec"]
        parts += [f"{rate:,.0f} tok/s", f"{row['tflops_per_device']:.3g} TFLOP/s/device"]
        parts += [f"MFU {row['mfu']:.1%}"] if "mfu" in row else []
        parts += [f"ETA {eta((t.steps - step) * t.batch_size * t.seq_len / rate)}"]
    return " | ".join(parts)
