"""training/progress.py's words and rates, called directly: the throughput since a restart (tokens/s, TFLOP/s per
device, MFU against a known peak), the lines a run says before its first step, and a logged step's progress line;
with the profiler's trace window and the run's config in TensorBoard, the other things a run reports."""

import re
import time

import jax
import jax.numpy as jnp
import pytest
from helpers import tiny_config

from freeatten_jax.nn import sharding
from freeatten_jax.training import config, flops, metrics, profiler, progress


def _cfg(text_glob, **overrides):
    return config.parse(tiny_config("softmax", text_glob, **overrides))


def _mesh():
    return sharding.make_mesh((1, 1, 1), jax.devices()[:1])


def test_the_rates_are_of_the_steps_since_the_last_restart_and_mfu_is_against_the_peak(text_glob):
    cfg = _cfg(text_glob, **{"train.peak_tflops": 0.001})
    throughput = progress.Throughput(cfg, 2, 3)
    assert throughput.rates(3) == {}  # no step since the start
    throughput.restart(4)
    time.sleep(0.05)
    rates = throughput.rates(6)
    tokens = 2 * 8 * 16  # two steps of batch 8 x 16 tokens
    assert 0 < rates["tokens_per_sec"] < tokens / 0.05
    flops_per_token = flops.train_flops_per_token(cfg.model, 16)
    assert rates["tflops_per_device"] == pytest.approx(rates["tokens_per_sec"] * flops_per_token / 2 / 1e12)
    assert rates["mfu"] == pytest.approx(rates["tflops_per_device"] / 0.001)
    assert "mfu" not in progress.Throughput(_cfg(text_glob), 1, 0).rates(1)  # no known peak for a CPU
    assert throughput.elapsed() >= 0.05


def test_the_start_lines_say_what_trains_where_and_what_its_schedule_misses(text_glob):
    cfg = _cfg(text_glob, **{"train.steps": 3, "train.log_every": 25, "optim.warmup_steps": 50})
    lines = progress.start_lines(cfg, _mesh(), 1)
    assert lines[0] == (
        "training softmax for steps 2..3: 1 devices, mesh {'data': 1, 'fsdp': 1, 'tensor': 1, 'context': 1}, batch 8 x 16 tokens"
    )
    assert "MFU not reported: no known peak for device 'cpu'; set --config.train.peak_tflops" in lines
    assert (
        "warning: optim.warmup_steps=50 >= train.steps=3: the learning rate peaks at 0.0004 at the last step and never "
        "reaches optim.lr=0.01" in lines
    )
    assert "warning: train.log_every=25 > train.steps=3: only the first and the last step are logged" in lines
    assert progress.start_lines(_cfg(text_glob, **{"train.peak_tflops": 1.0}), _mesh(), 0)[1:] == []  # nothing to warn of


def test_a_logged_steps_line_has_its_losses_lr_rates_and_eta(text_glob):
    t = _cfg(text_glob, **{"train.steps": 100}).train
    row = {"loss": 2.5, "val_loss": 2.25, "elapsed_sec": 75.0, "tokens_per_sec": 1280.0, "tflops_per_device": 0.5, "mfu": 0.25}
    assert progress.line(t, 10, row, 1e-3) == (
        "step 10/100 | loss 2.5000 | val 2.2500 | lr 1.00e-03 | elapsed 1m15s | 1,280 tok/s | 0.5 TFLOP/s/device | "
        "MFU 25.0% | ETA 0m09s"
    )
    assert (
        progress.line(t, 1, {"loss": 3.0, "elapsed_sec": 3725.0}, 0.0) == "step 1/100 | loss 3.0000 | lr 0.00e+00 | elapsed 1h02m"
    )


def test_the_profiler_traces_its_window_of_steps_only(tmp_path):
    window = profiler.Profiler((2, 3), tmp_path)
    for step in range(1, 5):
        window.before(step)
        assert window.running == (step in (2, 3))
        window.after(step, jnp.ones(2) * step)
        assert window.running == (step == 2)
    assert list((tmp_path / "profile").rglob("*.xplane.pb"))
    off = profiler.Profiler((), tmp_path / "off")
    off.before(1), off.after(1, None)
    assert not (tmp_path / "off").exists()


def test_the_runs_config_and_its_rates_reach_tensorboard(tmp_path):
    writer = metrics.MetricsWriter(tmp_path, 0, {"train": {"profile_steps": [2, 3]}})
    writer.write(1, {"loss": 2.0, "tflops_per_device": 0.5})
    writer.close()
    events = b"".join(p.read_bytes() for p in (tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert b"profile_steps" in events and b"tflops_per_device" in events
    assert [re.sub(r"\s", "", line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        '{"step":1,"loss":2.0,"tflops_per_device":0.5}'
    ]
