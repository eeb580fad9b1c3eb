"""benchmarks/device_check.py --tiny end to end on the CPU: its limits, its imports and its tables' values."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOT_ON_THE_DEVICE = ("grain", "ml_collections", "tokenizers", "matplotlib")  # the lent H200 has none of them


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tables(text: str) -> dict[str, list[list[str]]]:
    """Each `## step` section's table rows (header and rule dropped), cells stripped."""
    sections = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.S | re.M))
    return {
        name: [
            [cell.strip() for cell in line.strip("|").split("|")]
            for line in body.splitlines()
            if line.startswith("|") and not line.startswith("|---")
        ][1:]
        for name, body in sections.items()
    }


def test_the_steps_limits_add_up_to_at_most_8_minutes():
    assert sum(_module("device_check").STEP_LIMITS.values()) <= 480


@pytest.mark.slow
def test_tiny_mode_runs_end_to_end_without_the_packages_the_device_lacks(tmp_path):
    """Every step runs with grain, ml_collections, tokenizers and matplotlib unimportable, and each table's
    numbers follow from its measurements (ratios, the tolerance rule, the fastest blocks)."""
    blocked = tmp_path / "blocked"
    for name in NOT_ON_THE_DEVICE:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is not on the device')\n")
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(blocked), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "benchmarks/device_check.py", "--tiny"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    report = (tmp_path / "device_check.md").read_text()
    tables = _tables(report)
    summary = {name: int(status) for name, status, _, _ in _tables("## summary\n" + report.split("\n## ")[0])["summary"]}
    assert list(summary) == list(_module("device_check").STEP_LIMITS)

    failed = [row[0] for row in tables["correctness"] if row[-1] == "FAIL"]
    numbers = lambda cell: [float(x) for x in cell.split(",")]  # noqa: E731
    for variant, _, ratios, split_ratios, ref_errors, _, ok in tables["correctness"]:
        assert ok == ("ok" if max(numbers(ratios)) <= 2.0 else "FAIL"), variant  # FlashAttention's contract
        assert min(numbers(ratios) + numbers(split_ratios)) > 0.5 and max(numbers(ref_errors)) < 1e-2, variant
    assert [row[0] for row in tables["correctness"]] == ["softmax", "lssar"]
    assert "softmax" not in failed and tables["correctness"][0][5]  # cuDNN's (here XLA's) errors beside softmax
    assert summary == {**dict.fromkeys(summary, 0), "correctness": int(bool(failed))}, result.stdout[-3000:]
    assert result.returncode == max(summary.values())

    for step in ("unpacked", "long", "packed"):
        base = float(tables[step][0][2])
        assert [row[3] for row in tables[step][:1]] == ["1"]
        for label, _fwd, both, ratio, _tflops in tables[step]:
            assert abs(float(ratio) - base / float(both)) <= 0.01 * float(ratio) + 1e-3, label
    assert [row[0] for row in tables["unpacked"]] == ["softmax, xla", "softmax, pallas", "lssar, pallas, split_matmuls"]
    assert [row[0] for row in tables["long"]] == ["softmax, xla", "softmax, pallas", "softmax, pallas, block_k_dkv=32"]
    assert [row[0] for row in tables["packed"]] == ["softmax, xla, documents as a batch", "softmax, pallas, packed"]
    error = float(re.search(r"pallas out err .*: (\S+)", report).group(1))
    assert error < 2 * 2**-8

    sweep = {(int(q), int(k), int(dkv)): float(ms) for _, q, k, dkv, ms in tables["sweep"]}
    assert len(sweep) == 2 and f"GPU_BLOCKS = {{'softmax': {min(sweep, key=sweep.get)}}}" in report
    assert re.search(r"\b4 passed", report) and "failed" not in report.split("## kernel tests")[1]
