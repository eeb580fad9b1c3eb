"""benchmarks/device_route.py on the CPU: --tiny's tables and route decision follow from its measurements, the probe
loads from --probe (a stand-in written here), and no step needs a package the device lacks."""

import importlib.util
import math
import pathlib
import re
import subprocess
import sys

import pytest
from helpers import subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOT_ON_THE_DEVICE = ("grain", "ml_collections", "tokenizers", "matplotlib")
PROBE_LABELS = [
    "lssa probe, mufu",
    "lssa probe, poly4",
    "lssa probe, split4",
    "lssa probe, poly",
    "lssa probe, mufu, round_z=0",
]
STAND_IN = '''"""Stands in for the research note's lssa_mgpu.py: its lssa_forward's signature, in plain jnp."""
import jax
import jax.numpy as jnp


def lssa_forward(q, k, v, *, scale, mode, causal, interpret, round_z):
    assert mode in ("mufu", "poly4", "split4", "poly") and causal and interpret, (mode, causal, interpret)
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    u = jnp.where(jnp.tri(q.shape[1], dtype=bool), jax.nn.softplus(scale * jnp.einsum("bthd,bshd->bhts", q32, k32)), 0.0)
    return jnp.einsum("bhts,bshd->bthd", u / u.sum(-1, keepdims=True), v32).astype(q.dtype)
'''


def run_script(name: str, args: list[str], tmp_path) -> tuple[subprocess.CompletedProcess, str]:
    """benchmarks/NAME.py ARGS on the CPU with the device's missing packages unimportable: (result, $OUT/NAME.md)."""
    blocked = tmp_path / "blocked"
    for module in NOT_ON_THE_DEVICE:
        (blocked / module).mkdir(parents=True)
        (blocked / module / "__init__.py").write_text(f"raise ImportError('{module} is not on the device')\n")
    env = subprocess_env(1, OUT=str(tmp_path), PYTHONPATH=str(blocked), JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, f"benchmarks/{name}.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result, (tmp_path / f"{name}.md").read_text()


def table_rows(text: str) -> list[list[str]]:
    """A markdown text's table rows, header and rule dropped, cells stripped."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    return [row for row in rows if not row[0].startswith("---") and row[0] != "row"]


def sections(report: str) -> dict[str, list[list[str]]]:
    """Each `## step (budget ...)` section's table rows, by step."""
    return {part.split()[0]: table_rows(part) for part in report.split("\n## ")[1:]}


def _module():
    spec = importlib.util.spec_from_file_location("device_route", ROOT / "benchmarks" / "device_route.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_steps_budgets_fit_the_6_minute_limit():
    route = _module()
    assert sum(route.STEP_SECONDS.values()) <= route.LIMIT - 30 and route.LIMIT <= 360


@pytest.mark.parametrize(
    "ratios, verdict",
    [
        ({"poly4": 0.62, "split4": 0.8}, "build the LSSA backward next"),
        ({"poly4": 0.5, "split4": 0.59}, "hand-tune the elementwise code first"),
        ({"poly4": 0.7}, "the rule decides neither"),
        ({}, "not measured"),
    ],
)
def test_the_route_decision_is_the_notes_rule_on_the_better_of_poly4_and_split4(ratios, verdict):
    route = _module()
    run = route.Run(route.FULL, route.Report(None), None, "not carried")
    run.times[run.base, 128] = (1.0, 3.0)
    for mode, ratio in ratios.items():
        run.times[f"lssa probe, {mode}", 128] = (1.0 / ratio, None)
    run.times["lssa probe, mufu", 128] = (0.5, None)  # 2x cuDNN: mufu does not decide
    line = route.decision(run)
    assert verdict in line and line.startswith("route decision")
    if ratios:
        assert f"best {max(ratios.values()):.3g}x" in line


def test_no_budget_reaches_no_row_and_without_the_probe_its_rows_say_not_carried(tmp_path):
    _, report = run_script("device_route", ["--tiny", "--budget_scale", "0"], tmp_path)
    steps = sections(report)
    assert list(steps) == ["baseline", "probe", "mgpu", "errors", "pallas"]
    for step, rows in steps.items():
        for row in rows:
            probe_row = row[0].startswith("lssa probe")
            expected = "not carried" if probe_row else "needs a GPU" if "mgpu" in row[0] else "not reached"
            assert row[2].startswith(expected), (step, row)
    assert [row[0] for row in steps["probe"]] == PROBE_LABELS
    assert "route decision: not measured" in report
    assert "| not carried |" in report.split("## baseline")[0]  # the environment table names the probe's state


@pytest.mark.slow
def test_tiny_mode_times_every_row_and_its_numbers_follow_from_its_measurements(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "lssa_mgpu.py").write_text(STAND_IN)
    result, report = run_script("device_route", ["--tiny", "--probe", str(probe)], tmp_path)
    assert report.strip() == result.stdout.strip()
    steps = sections(report)
    t, heads, d = 128, 1, 64  # TINY's
    (base_row,) = steps["baseline"]
    assert base_row[:2] == ["softmax, xla", str(d)] and base_row[3] == base_row[5] == "1"
    base_fwd, base_both = float(base_row[2]), float(base_row[4])

    timed = steps["probe"] + steps["pallas"]
    assert [row[0] for row in timed] == PROBE_LABELS + ["lssa, pallas"]
    for label, dim, fwd, fwd_ratio, both, _, tflops in timed:
        assert dim == str(d) and float(fwd) > 0, label
        assert math.isclose(float(fwd_ratio), base_fwd / float(fwd), rel_tol=0.01), label
        assert math.isclose(float(tflops), 2 * heads * t**2 * d / (float(fwd) * 1e-3) / 1e12, rel_tol=0.01), label
        assert bool(both) == (label == "lssa, pallas"), label  # only the project's kernels have a backward here
    lssa_pallas = steps["pallas"][0]
    assert math.isclose(float(lssa_pallas[5]), base_both / float(lssa_pallas[4]), rel_tol=0.01)
    assert [row[2] for row in steps["mgpu"]] == ["needs a GPU (0.10.2's interpret mode lacks its run_state)"]

    errors = {row[0]: row[1:] for row in steps["errors"]}
    assert list(errors) == ["softmax, xla", "attention_mgpu, float16", *PROBE_LABELS, "lssa, pallas"]
    for label, (dtype, error, rounding, ratio) in errors.items():
        if label.startswith("attention_mgpu"):
            continue
        assert dtype == "bfloat16" and float(error) < 1e-2 and 1e-4 < float(rounding) < 4e-3, label
        assert math.isclose(float(ratio), float(error) / float(rounding), rel_tol=0.02) and float(ratio) <= 2.0, label

    ratios = {row[0]: float(row[3]) for row in timed}
    best = max(ratios["lssa probe, poly4"], ratios["lssa probe, split4"])
    verdict = "build the LSSA backward" if best >= 0.75 else "hand-tune" if best < 0.6 else "decides neither"
    decision = re.search(r"^route decision \(T=128, D=64; .*best (\S+)x\): (.*)$", report, re.M)
    assert decision and math.isclose(float(decision.group(1)), best, rel_tol=0.01) and verdict in decision.group(2)
    assert f"Mosaic GPU dumps: 0 files in {tmp_path / 'mosaic_dump'}" in report


def test_the_process_ends_at_its_limit_whatever_runs(tmp_path):
    """A run whose limit falls mid-step exits 124 and its report says where it stopped."""
    script = (
        "import sys; sys.argv[0] = 'benchmarks/device_route.py'; sys.path.insert(0, 'benchmarks')\n"
        "import device_route\ndevice_route.LIMIT = 0.5\ndevice_route.main(['--tiny'])\n"
    )
    env = subprocess_env(1, OUT=str(tmp_path), JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    report = (tmp_path / "device_route.md").read_text()
    assert result.returncode == 124 and "killed at the 2 s limit" in report and "route decision" not in report
