"""The static kernel budgets (`benchmarks/kernel_budget.py`) read the compiled kernels right, and the per-score
math keeps what it was cut to: counts that follow from the block shapes, and ceilings on the LSSA kernels'
instructions (static counts of the pinned toolchain's output; no time is measured)."""

import pathlib
import subprocess
import sys

import pytest
from helpers import subprocess_env

ROOT = pathlib.Path(__file__).resolve().parent.parent


def budget_table(*args) -> dict[str, list[str]]:
    """{kernel: cells} of one kernel_budget run (a fresh process: the dumps are asked for before libtpu or the
    CUDA plugin loads, and nothing comes from the compilation cache, which would skip the dump)."""
    env = subprocess_env(1, optimised=True, JAX_ENABLE_COMPILATION_CACHE="false")
    out = subprocess.run(
        [sys.executable, "benchmarks/kernel_budget.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    rows = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0]: cells[1:] for cells in rows[1:]}


@pytest.mark.slow
def test_tpu_bundle_table_counts_the_interior_step_of_each_kernel():
    """v5e, LSSA, 512 x 512 blocks, D = 128: vmatmul issues per MXU follow from the matmuls (16 rows of bfloat16 a
    push against a 128 x 128 tile, 4 MXUs; split matmuls run the weights' matmuls twice), one exp2 and one log2
    per float32 vreg of the [512, 512] scores, and the interior step takes fewer bundles than the masked one."""
    table = budget_table("--target", "v5e", "--variants", "lssa", "--seq_len", "1024")
    pushes = lambda matmuls: matmuls * (512 // 16) * (512 // 128) // 4  # noqa: E731  [512, 128] x [128, 512] each
    assert [int(table[f"lssa {k}"][2]) for k in ("fwd", "dq", "dkv")] == [pushes(3), pushes(4), pushes(6)]
    assert table["lssa fwd"][3].split(" / ")[:2] == ["256", "256"]
    for kind in ("fwd", "dq", "dkv"):
        interior, masked = (int(x.replace(",", "")) for x in table[f"lssa {kind}"][:2])
        assert 0 < interior < masked
    bound = float(table["lssa fwd"][4])
    assert bound == pytest.approx(2 * 128 * 512 * 512 / 65536 / int(table["lssa fwd"][0].replace(",", "")), abs=0.006)


@pytest.mark.slow
def test_gpu_budget_keeps_the_lssa_kernels_fused():
    """H100, LSSA: tensor FLOP per score from the matmuls (6·D forward with the split weights, 8·D dq, 12·D dK/dV),
    one exp2 per score, and ceilings that fail if the weighted sums stop accumulating in the matmul (+4 float32
    adds a score) or exp2 takes Triton's subnormal-safe form again (+3 instructions a score)."""
    table = budget_table("--variants", "lssa", "--seq_len", "1024")
    fwd, dq, dkv = (table[f"lssa {kind} interior"] for kind in ("fwd", "dq", "dkv"))
    assert [int(x[0]) for x in (fwd, dq, dkv)] == [6 * 128, 8 * 128, 12 * 128]
    assert float(fwd[1]) == 1.0
    assert float(fwd[4]) <= 25.0 and float(fwd[7]) >= 0.6  # all instructions per score; bound
    assert float(dq[7]) == 1.0 and float(dkv[7]) == 1.0  # both tensor-bound
