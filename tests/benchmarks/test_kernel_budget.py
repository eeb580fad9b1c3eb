"""The static kernel budgets (`benchmarks/kernel_budget.py`) read the compiled kernels right, and the per-score
math keeps what it was cut to: counts that follow from the block shapes, and ceilings on the LSSA kernels'
instructions (static counts of the pinned toolchain's output; no time is measured)."""

import pathlib
import subprocess
import sys

import pytest
from helpers import subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")]
    rows = [cells for cells in rows if not cells[0].startswith("---")]
    return {cells[0]: cells[1:] for cells in rows[1:]}


def interior_step_of_each_kernel(table):
    """v5e, LSSA, 512 x 512 blocks, D = 128: vmatmul issues per MXU follow from the matmuls (16 rows of bfloat16 a
    push against a 128 x 128 tile, 4 MXUs; weights and score gradients rounded once), one exp2 and one log2
    per float32 vreg of the [512, 512] scores, and the interior step takes fewer bundles than the masked one."""
    pushes = lambda matmuls: matmuls * (512 // 16) * (512 // 128) // 4  # noqa: E731  [512, 128] x [128, 512] each
    number = lambda cell: int(cell.replace(",", ""))  # noqa: E731
    assert [number(table[f"lssa {k}"][3]) for k in ("fwd", "dq", "dkv")] == [pushes(2), pushes(3), pushes(4)]
    assert table["lssa fwd"][4].split(" / ")[:2] == ["256", "256"]
    for kind in ("fwd", "dq", "dkv"):
        interior, masked = number(table[f"lssa {kind}"][0]), number(table[f"lssa {kind}"][2])
        steps, every = table[f"lssa {kind}"][1].split(" x ")
        assert 0 < interior < masked and steps == "1" and 0 < number(every) < interior / 4
    path = number(table["lssa fwd"][0]) + number(table["lssa fwd"][1].split(" x ")[1])
    assert float(table["lssa fwd"][5]) == pytest.approx(2 * 128 * 512 * 512 / 65536 / path, abs=0.006)


def lssar_forward_finishes_its_first_pass_once(table):
    """LSSAR's forward: two grid steps per key block (its two passes), and its first pass's row statistics
    computed once per row, at the pass's last step, not on every step (they cost ~1,200 bundles a step)."""
    steps, every = table["lssar fwd"][1].split(" x ")
    assert steps == "2" and int(every.replace(",", "")) < 400


def inference_forward_pushes(table):
    """Without a gradient LSSAR's forward kernel pushes three matmuls a key block (QKᵀ in each pass, r·V), not
    training's four (its y); LSSA's pushes two either way (QKᵀ, u·V)."""
    pushes = lambda variant, kind: int(table[f"{variant} {kind}"][3])  # noqa: E731
    assert (pushes("lssar", "fwd"), pushes("lssar", "fwd, no gradient")) == (4 * 32, 3 * 32)
    assert (pushes("lssa", "fwd"), pushes("lssa", "fwd, no gradient")) == (2 * 32, 2 * 32)


def whole_kernel_bundles(table):
    """--full_grid: at T = 1024 in 512 blocks (one interior pair, two diagonal ones) the folded grid takes 3 steps a
    head (LSSAR's forward 6) against the full grid's 4 (8), and its whole-kernel bundles are the table's own
    interior, masked and every-step bundles put together."""
    number = lambda cell: int(cell.replace(",", ""))  # noqa: E731
    for variant, passes in (("lssa", 1), ("lssar", 2)):
        for kind in ("fwd", "dq", "dkv"):
            sweeps = passes if kind == "fwd" else 1
            full_steps, _, folded_steps, folded, ratio = table[f"{variant} {kind}, whole kernel"]
            assert (number(full_steps), number(folded_steps)) == (4 * sweeps, 3 * sweeps)
            interior, steps_every, masked = table[f"{variant} {kind}"][:3]
            every = number(steps_every.split(" x ")[1])
            assert number(folded) == number(interior) + 2 * number(masked) + 3 * sweeps * every
            assert 0.8 < float(ratio) < 1.2


@pytest.mark.slow
def test_tpu_bundle_table():
    """One v5e table (LSSA and LSSAR at T = 1024, with the full grid and the forward without a gradient) checked
    for each property above: one test, because a module fixture is built again on every xdist worker that runs
    one of its tests (CI built this one three times, ~300 s each)."""
    table = budget_table("--target", "v5e", "--variants", "lssa,lssar", "--seq_len", "1024", "--full_grid")
    for check in (
        interior_step_of_each_kernel,
        lssar_forward_finishes_its_first_pass_once,
        inference_forward_pushes,
        whole_kernel_bundles,
    ):
        check(table)


@pytest.mark.slow
def test_gpu_budget_keeps_the_lssa_kernels_fused():
    """H100, LSSA: tensor FLOP per score from the matmuls (4·D forward, 6·D dq, 8·D dK/dV: weights and score gradients
    rounded once, FlashAttention's contract) plus 32 for each row sum of weights on the tensor cores (a [C, 16] matmul
    with ones, gpu.rounded_row_sum), one exp2 per score, and limits that fail if the weighted sums stop accumulating in
    the matmul (+4 float32 adds a score), exp2 takes Triton's subnormal-safe form again (+3 instructions a score), the
    row sum goes back to a float32 add a score or the polynomial log gains a term (+1 each: issue 49's forward gate
    0.85 is 18.8 instructions a score); LSSAR's forward at 8·D (QKᵀ twice, two passes) + 2 row sums, 6·D + 1 without
    a gradient (no y), and its dq and dK/dV kernels (6·D and 8·D) spill nothing at its default 64 x 32 blocks
    (gpu.GPU_BLOCKS, from the device check) and stay at their 0.38."""
    table = budget_table("--variants", "lssa,lssar", "--seq_len", "1024", "--kernels", "triton")
    fwd, dq, dkv = (table[f"lssa {kind} interior"] for kind in ("fwd", "dq", "dkv"))
    assert [int(x[0]) for x in (fwd, dq, dkv)] == [4 * 128 + 32, 6 * 128, 8 * 128]
    assert float(fwd[1]) == 1.0
    assert float(fwd[4]) <= 18.8 and float(fwd[7]) >= 0.85  # all instructions per score; bound
    assert float(dq[7]) == 1.0 and float(dkv[7]) >= 0.9
    backward = table["lssa backward interior (dq + dkv at 10·D per score)"]
    assert (fwd[8], backward[-1]) == ("0.94", "0.71")  # the ceilings: 4·D of 4·D + 32, 10·D of 14·D
    assert float(backward[-2]) >= 0.65  # issue 49's backward gate
    lssar = table["lssar fwd interior"]
    assert (int(lssar[0]), lssar[8]) == (8 * 128 + 2 * 32, "0.47")
    inference = table["lssar fwd, no gradient interior"]  # no gradient: no y, 6·D
    assert (int(inference[0]), inference[8]) == (6 * 128 + 32, "0.64")
    assert int(table["lssa fwd, no gradient interior"][0]) == 4 * 128 + 32
    for kind, flop in (("dq", 6 * 128), ("dkv", 8 * 128)):
        row = table[f"lssar {kind} interior"]
        assert (int(row[0]), row[6].split(", ")[1]) == (flop, "0"), kind  # tensor FLOP a score; spill bytes
    assert float(table["lssar backward interior (dq + dkv at 10·D per score)"][-2]) >= 0.38


@pytest.mark.slow
def test_gpu_budget_of_a_smaller_dkv_key_block():
    """--block_k_dkv 32: the dK/dV kernel's loop covers 64 queries x 32 keys (tensor FLOP a score still 8·D for LSSA)
    and its accumulators fit in the registers: no spill (64 keys spill 1,400 bytes)."""
    table = budget_table("--variants", "lssa", "--seq_len", "1024", "--block_k_dkv", "32", "--kernels", "triton")
    dkv = table["lssa dkv interior"]
    assert (int(dkv[0]), dkv[6].split(", ")[1], dkv[5]) == (8 * 128, "0", "0")


@pytest.mark.slow
def test_mosaic_gpu_forward_budget():
    """The Mosaic GPU forward (LSSA) at T = 1024, D = 128 and 64: two HGMMA loops (interior, edge), each at 4·D tensor
    FLOP a score (QKᵀ and PV, one key block a body), no spill, one MUFU a score in the interior (exp2; the log on
    the FMA pipes), the issue's gates on the interior: at most 15 instructions a score (14.5 with the degree-4
    polynomial and paired bfloat16 rounding; 18.5 with degree 7, 15.5 with Mosaic's own rounding) and 1.5 MUFU;
    the masked blocks cost more."""
    table = budget_table("--kernels", "mosaic_gpu", "--mosaic_shapes", "1024x128,1024x64")
    for d in (128, 64):
        interior, edge = (table[f"lssa fwd mosaic_gpu T=1024 D={d} {part}"] for part in ("interior", "edge"))
        for row in (interior, edge):
            assert (int(row[0]), row[5], row[6].split(", ")[1], row[8]) == (4 * d, "0", "0", "1.00"), d
        assert 0.99 <= float(interior[1]) <= 1.5 and float(interior[4]) <= 15.0, interior
        assert float(edge[4]) > float(interior[4])
