"""Compiling for real chips without them (`freeatten_jax.compile`): the small matrix that `make test` runs.

TPU through libtpu's deviceless topologies, H100 through the CUDA PJRT plugin and ptxas (the [compile]
extra). A real compile, unlike lowering, checks VMEM, shared memory, HBM and how the partitioner treats
the kernels. The full matrix (every variant x T x target) is `make compile-check`.
"""
import pytest

from freeatten_jax.compile import DoesNotFit, compile_attention, compile_train_step
from freeatten_jax.configs import base


@pytest.mark.parametrize("target", ["v5e-8", "h100"])
def test_lssar_forward_backward_compiles_at_32k(target):
    """LSSAR's three kernels (forward, dq, dkv) compile at T = 32K, 16 heads of 128, bf16: on v5e inside its
    VMEM (streamed K/V; the old kernels needed 33M of a 16M scope here), on H100 inside its shared memory."""
    report = compile_attention(target, variant="lssar", seq_len=32768)
    assert report.kernels == 3
    assert 0 < report.peak < report.hbm


def _step_config(implementation: str, batch: int):
    cfg = base.get_config("lssar", "tiny")
    cfg.model.implementation = implementation
    cfg.train.seq_len, cfg.train.batch_size = 256, batch
    return cfg


def test_pallas_train_step_compiles_on_a_v5p_8_data_mesh():
    """The tiny lssar model's step with implementation="pallas" on v5p-8 (8 TensorCores, data mesh): Mosaic
    calls cannot be partitioned by XLA, so this compiles only because each runs in shard_map on its shard."""
    report = compile_train_step(_step_config("pallas", 16), "v5p-8")
    assert report.kernels > 0 and report.peak < report.hbm


def test_an_overflow_is_one_line_naming_the_knob():
    """Blocks of 512 x 512 need more shared memory than an H100 block has: one line names it and the knob."""
    with pytest.raises(DoesNotFit) as error:
        compile_attention("h100", variant="softmax", seq_len=1024, heads=1, block_q=512, block_k=512)
    message = str(error.value)
    assert "\n" not in message and "shared memory" in message and "block_q" in message


def test_an_hbm_overflow_names_the_knob_of_what_was_compiled():
    from freeatten_jax.compile import run

    error = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM: Used 90G of 80G hbm")
    step, alone = run.explain(error, "h100"), run.explain(error, "h100", run.ATTENTION_HBM_KNOB)
    assert str(step) == "h100: device HBM overflow (RESOURCE_EXHAUSTED: Ran out of memory on HBM: Used 90G of 80G hbm): " + run.STEP_HBM_KNOB
    assert str(alone).endswith(": shorten --seq_len or lower --heads (a training step shards heads over the mesh's tensor axis)")
    assert run.explain(ValueError("unrelated"), "h100").args == ("unrelated",)

