"""The long-context step's memory accounting (`benchmarks/memory_accounting.py`, issue 54) on one small case, so a
regression of the step's memory fails CI: a 1-layer gpt2_small LSSAR step with the kernels in the ring, compiled for
a v5e-8 without the chips (T = 16,384 over a context axis of 4), read from XLA's buffer assignment."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import memory_accounting  # noqa: E402

T, CONTEXT = 16384, 4


@pytest.fixture(scope="module")
def accounting():
    return memory_accounting.account(f"v5e-8:{T}:{CONTEXT}", layers=1)


def test_the_floor_is_the_models_shapes(accounting):
    """The floor, recomputed by hand: gpt2_small's embedding and one block as float32 parameter, gradient and Adam's
    two moments (replicated: no fsdp), one saved bf16 layer input and one layer's working set of T / context tokens."""
    vocab, embed, mlp, tokens = 50257, 768, 3072, T // CONTEXT
    block = 4 * embed * embed + 2 * embed * mlp + 4 * embed + embed + mlp  # q, k, v, o; the MLP; two norms; biases
    assert accounting.floor["saved layer inputs"] == tokens * embed * 2
    assert accounting.floor["one layer's working set"] == tokens * 2 * (8 * embed + 3 * mlp)
    assert accounting.floor["state"] == pytest.approx(16 * (vocab * embed + block), rel=0.01)


def test_the_peak_stays_near_the_floor_and_no_row_statistic_is_lane_padded(accounting):
    """XLA's peak within 1.4x the floor (1.26x; 1.22x before the head-dim rows were packed: at one layer of 4,096 tokens
    a chip their transposes cost more than the padding; 1.56x before nn.together), at least the heap as the buffer
    assignment packed it, and that at least the buffers it found live; the row statistics [.., 1] float32 that a TPU
    pads 128x (2.5x the peak when the ring carried them so) take none of it; the parameters and Adam's moments are read
    as arguments (three float32 copies of the state's four)."""
    floor, live = sum(accounting.floor.values()), sum(row[0] for row in accounting.rows)
    assert live <= accounting.packed <= accounting.peak <= 1.4 * floor, (accounting.peak / floor, live / floor)
    categories = accounting.by_category()
    rows = categories.get("row statistics [.., 1] float32 (lane-padded)", [0, 0, 0])
    assert rows[0] < 0.01 * accounting.peak
    arguments = categories["arguments (parameters, optimizer state, batch)"][1]
    assert arguments == pytest.approx(0.75 * accounting.floor["state"], rel=0.01)


def test_no_kernel_writes_a_lane_padded_array(accounting):
    """Every array a kernel of the step writes is laid out at its own bytes: gpt2_small's [.., T / context, 64] outputs,
    accumulators and sums packed two tokens a 128-lane row (half of each row padding otherwise: 9.08 against 6.67
    GiB a chip at 1M tokens on a v5p-32), the row statistics lane-dense."""
    assert accounting.padded == [], accounting.padded[:5]
