"""benchmarks/device_model_step.py on the CPU: --tiny's rows, their tokens/s, FLOPs and MFU from their step times
and the trainer's FLOP count, the loss of real training steps, the budgets, and no package the device lacks."""

import math

import pytest

from freeatten_jax.nn import preset
from freeatten_jax.training import flops

from .test_device_route import run_script, table_rows

VARIANTS = ["softmax", "ssmax", "lssa", "lssar"]
TINY_SHAPES = [(64, 2), (128, 1)]  # (T, batch)


def test_no_budget_reaches_no_row(tmp_path):
    _, report = run_script("device_model_step", ["--tiny", "--budget_scale", "0"], tmp_path)
    header, *rows = table_rows(report)  # the header's first cell is "variant"
    assert [row[:2] for row in rows] == [[v, f"{t} x {b}"] for t, b in TINY_SHAPES for v in VARIANTS]
    assert all(row[2] == "not reached" and not any(row[3:]) and len(row) == len(header) for row in rows)


@pytest.mark.slow
def test_tiny_mode_times_every_variant_and_its_numbers_follow_from_its_step_times(tmp_path):
    _, report = run_script("device_model_step", ["--tiny"], tmp_path)
    rows = table_rows(report)[1:]
    assert [row[:2] for row in rows] == [[v, f"{t} x {b}"] for t, b in TINY_SHAPES for v in VARIANTS]
    assert "MFU against 989 TFLOP/s" in report  # the H100's peak: the CPU is not in flops.PEAK_TFLOPS
    for variant, shape, path, compile_s, step_ms, steps, tokens_s, gflop, tflops, mfu, losses in rows:
        t, batch = map(int, shape.split(" x "))
        cfg = preset("tiny", num_layers=1, dtype="bfloat16", attention=variant, max_len=t)
        assert path == "reference" and float(compile_s) > 0 and steps == "2", (variant, shape)
        assert math.isclose(float(tokens_s), batch * t / (float(step_ms) / 1e3), rel_tol=0.01), (variant, shape)
        assert math.isclose(float(gflop), flops.train_flops_per_token(cfg, t) / 1e9, rel_tol=1e-3), (variant, shape)
        assert math.isclose(float(tflops), float(tokens_s) * float(gflop) / 1e3, rel_tol=0.01), (variant, shape)
        assert math.isclose(float(mfu), float(tflops) / 989.0, rel_tol=0.01), (variant, shape)
        first, last = map(float, losses.split(", "))
        assert abs(first - math.log(cfg.vocab_size)) < 0.1 and last < first, (variant, shape)  # AdamW on one batch
