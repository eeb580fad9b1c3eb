"""Compiling for real chips without them (`freeatten_jax.compile`): the small matrix that `make test` runs.

TPU through libtpu's deviceless topologies, H100 through the CUDA PJRT plugin and ptxas (the [compile]
extra). A real compile, unlike lowering, checks VMEM, shared memory, HBM and how the partitioner treats
the kernels. The full matrix (every variant x T x target) is `make compile-check`.
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import jax
import pytest

from freeatten_jax.cli import compile as compile_cli
from freeatten_jax.compile import DoesNotFit, compile_attention, compile_train_step, run, targets
from freeatten_jax.configs import base, mqar
from freeatten_jax.nn import sharding
from freeatten_jax.training import config, distributed, loop, optim
from freeatten_jax.training import state as train_state


@pytest.mark.parametrize("target", ["v5e-8", "h100"])
def test_lssar_forward_backward_compiles_at_32k(target):
    """LSSAR's kernels (forward, dq, dkv) compile at T = 32K, 16 heads of
    128, bf16: on v5e inside its VMEM (streamed K/V; the old kernels needed 33M of a 16M scope here), on H100
    inside its shared memory; on v5e within 1.25x softmax's peak memory (per-row arrays lane-dense in HBM)."""
    report = compile_attention(target, variant="lssar", seq_len=32768)
    assert report.kernels == 3
    assert 0 < report.peak < report.hbm
    if target.startswith("v5e"):  # its seven statistics and eight row terms lane-dense: 1.9x softmax's peak when not
        assert report.peak < 1.25 * compile_attention(target, variant="softmax", seq_len=32768).peak


@pytest.mark.parametrize("target", ["v6e-8"])  # H100's and v5e's compile in test_kernel_budget.py
def test_lssar_inference_forward_compiles_as_one_kernel_at_softmaxs_memory(target):
    """Without a gradient LSSAR's forward is one kernel, its output passes alone, and compiles at 32K; writing no
    statistics, no y and no low half, it peaks within 1% of softmax's memory (its key factors: +1 MiB; 5.09 against
    softmax's 3.64 GiB at 128K on a v5e when inference ran the training forward)."""
    report = compile_attention(target, variant="lssar", seq_len=32768, gradients=False)
    assert report.kernels == 1
    assert report.peak < 1.01 * compile_attention(target, variant="softmax", seq_len=32768, gradients=False).peak


def _step_config(implementation: str, batch: int):
    cfg = base.get_config("lssar", "tiny")
    cfg.model.implementation, cfg.model.num_layers, cfg.model.dtype = (
        implementation,
        1,
        "bfloat16",
    )  # bf16: half the Triton compile time
    cfg.train.seq_len, cfg.train.batch_size = 128, batch
    return cfg


@pytest.mark.parametrize("target", ["v5p-8"])  # 8xh100: the context-parallel step below, over data and context
def test_pallas_train_step_runs_each_devices_kernels_on_its_shard_of_the_batch(target):
    """The tiny lssar step with implementation="pallas" on a data mesh (v5p-8: 4 chips). Mosaic calls cannot be
    partitioned by XLA (nor Triton calls: they get replicated, every GPU on the global batch), so this holds only
    because each kernel runs in shard_map: every operand of every kernel call carries the per-device batch
    (40 / devices), none the global 40 (no other dim of this model is 40)."""
    global_batch = 40
    per_device = global_batch // len(targets.devices(target))
    report = compile_train_step(_step_config("pallas", global_batch), target)
    assert report.kernels == 3 and report.peak < report.hbm  # one layer: forward, dq, dkv
    shapes = [shape for call in report.kernel_operands for shape in call]
    assert any(shape[:1] == (per_device,) and len(shape) == 4 for shape in shapes)  # q_BHTD
    assert all(global_batch not in shape for shape in shapes)
    assert all(per_device in shape for shape in shapes if len(shape) >= 2)


@pytest.mark.parametrize("target, context", [("8xh100", 4)])  # TPU: lowered below, compiled by benchmarks/long_context.py
def test_context_parallel_step_runs_the_kernels_on_each_chunk_and_chunks_the_loss(target, context):
    """One gpt2_small layer's LSSAR step at T = 32K, the batch split over data replicas and each sequence over
    `context` GPUs: every kernel call sees this GPU's chunk (T / context), none the whole sequence (a ring step that
    fell back to the blockwise rules would make no kernel call: the count is exact), and this replica's share of
    the batch (3), none the global 6 (Triton calls outside shard_map get replicated); no kernel operand is a row
    statistic [B, H, T / context, 1] (the ring's carries are lane-dense: padded 128x on a TPU otherwise); every
    rotation of a ring step (K, V, key factors; dK/dV sums) runs during a kernel call of the step (forward 2 + 3 in each
    pass's first step and again in its loop, XLA's GPU combiner joining the two first steps' key factors: 9; backward
    5; the zig-zag layout's permutes not counted); no buffer holds a chunk's whole logits (the loss takes them in chunks
    of the sequence)."""
    t, vocab, per_replica = 32768, 50257, 3
    cfg = base.get_config("lssar", "gpt2_small")
    replicas = len(targets.devices(target)) // context
    cfg.model.implementation, cfg.model.num_layers, cfg.model.dtype = "pallas", 1, "bfloat16"
    cfg.mesh.shape, cfg.train.seq_len, cfg.train.grad_accum_steps = (replicas, 1, 1, context), t, 1
    cfg.train.batch_size = per_replica * replicas
    compiled = run.lower_train_step(config.parse(cfg, reads_data=False), targets.devices(target)).compile()
    operands = run.kernel_operands(compiled.as_text())
    assert len(operands) == 6  # LSSAR's two forward passes (each the ring's first step, then the rest), dq, dkv
    lengths = {dim for call in operands for shape in call for dim in shape if dim >= 1024}
    assert lengths == {t // context}, lengths
    shapes = [shape for call in operands for shape in call if len(shape) >= 2]
    assert all(per_replica in shape and per_replica * replicas not in shape for shape in shapes), shapes
    assert (per_replica, 12, t // context, 1) not in shapes, shapes
    assert run.exposed_permutes(compiled.as_text()) == (14, [])
    logits = re.findall(rf"f32\[([\d,]*\b{vocab}\b[\d,]*)\]", compiled.as_text())
    assert logits and all(str(t // context) not in shape.split(",") for shape in logits), sorted(set(logits))


def test_two_slices_keep_the_ring_inside_a_slice_and_send_only_the_gradient_reduction_between_them():
    """2 x v5p-8 (libtpu's topology of two slices) with mesh.slices=2: 'data' spans the slices, context stays inside
    each. Every collective of the compiled program joins chips of one slice (the ring's 15 rotations among them,
    each overlapping a kernel); what crosses slices (the megascale runtime's transfers over DCN) is all-reduces
    only. A single-slice mesh over both slices' chips is refused in one line."""
    target, per_slice = "2xv5p-8", 4
    cfg = base.get_config("lssar", "tiny")
    cfg.model.implementation, cfg.model.num_layers, cfg.model.dtype = "pallas", 1, "bfloat16"
    cfg.mesh.shape, cfg.mesh.slices, cfg.train.seq_len, cfg.train.batch_size = (2, 1, 1, per_slice), 2, 512, 2
    hlo = run.lower_train_step(config.parse(cfg, reads_data=False), targets.devices(target)).compile().as_text()
    found = run.collectives(hlo, 2 * per_slice)
    assert sum(op == "collective-permute" for op, _ in found) >= 10
    assert all(i < per_slice for _, groups in found for group in groups for i in group), found
    assert run.exposed_permutes(hlo) == (15, [])
    crossing = run.dcn_collectives(hlo)
    assert crossing and all(name.startswith("all-reduce.") for name in crossing), crossing
    cfg.mesh.slices = 1
    with pytest.raises(ValueError, match=r"^mesh.slices=1, but the 8 devices are in 2 slices: set mesh.slices=2$"):
        run.lower_train_step(config.parse(cfg, reads_data=False), targets.devices(target))


def test_an_overflow_is_one_line_naming_the_knob():
    """Blocks of 256 x 128 with Gemma's head dim of 256 need more shared memory than an H100 block has: one line names
    it and the knob (Triton gives up on these in a few seconds; on 512 x 512 blocks of 128 it takes 15)."""
    with pytest.raises(DoesNotFit) as error:
        compile_attention("h100", variant="softmax", seq_len=1024, heads=1, head_dim=256, block_q=256, block_k=128)
    message = str(error.value)
    assert "\n" not in message and "shared memory" in message and "block_q" in message


def test_an_hbm_overflow_names_the_knob_of_what_was_compiled():
    error = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM: Used 90G of 80G hbm")
    step, alone = run.explain(error, "h100"), run.explain(error, "h100", run.ATTENTION_HBM_KNOB)
    assert (
        str(step)
        == "h100: device HBM overflow (RESOURCE_EXHAUSTED: Ran out of memory on HBM: Used 90 GiB of 80 GiB hbm): "
        + run.STEP_HBM_KNOB
    )
    assert str(alone).endswith(": shorten --seq_len or lower --heads (a training step shards heads over the mesh's tensor axis)")
    assert run.explain(ValueError("unrelated"), "h100").args == ("unrelated",)


def test_an_overflow_gives_sizes_in_the_reports_units():
    """libtpu writes 97.99G, XLA 1.50GiB, the Report 95.00 GiB: the one line writes them all as the Report does."""
    tpu = RuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (97.99G) exceeds "
        "available HBM (95.74G)."
    )
    assert "for HLO temporaries (97.99 GiB) exceeds available HBM (95.74 GiB).)" in str(run.explain(tpu, "v5p-8"))
    gpu = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50GiB on h100, v5p-8.")
    assert "allocate 1.50 GiB on h100, v5p-8.)" in str(run.explain(gpu, "h100"))


def test_the_compiled_step_is_the_one_training_runs(tmp_path, monkeypatch):
    """MQAR's loss counts the answers only (data.loss_targets): freeatten-compile's program, compiled for this CPU
    and run on training's first batch from training's initial state, gives the loss training logged at step 1."""
    cfg_dict = mqar.get_config("variant=lssar")
    small = {"model.num_layers": 1, "model.d_model": 32, "model.num_heads": 2, "model.mlp_dim": 64}
    run_ = {"train.seq_len": 24, "train.batch_size": 8, "train.steps": 1, "train.eval_windows": 8, "mesh.shape": (1, 1, 1)}
    cfg_dict.update_from_flattened_dict({**small, **run_})
    batches = []
    place = distributed.host_local_batch_to_global
    monkeypatch.setattr(distributed, "host_local_batch_to_global", lambda *args: batches.append(place(*args)) or batches[-1])
    (logged,) = loop.train_and_evaluate(cfg_dict, tmp_path)
    cfg = config.parse(cfg_dict)
    mesh, tx = sharding.make_mesh(cfg.mesh.shape, jax.devices()[:1]), optim.make(cfg.optim, cfg.train.steps)
    state = train_state.create(cfg, mesh, tx, train_state.abstract_state(cfg, mesh, tx)[1])
    _, metrics = run.lower_train_step(cfg, jax.devices()[:1]).compile()(state, batches[0])
    assert logged["step"] == 1 and float(metrics["loss"]) == logged["loss"]


def _readme_command(target: str) -> list[str]:
    """The documents' one `freeatten-compile --target=TARGET --config=...:gpt2_small ...` command (continuation lines
    joined): v5p-8's in docs/training.md, v5p-32's in docs/context_parallel.md."""
    root = pathlib.Path(__file__).resolve().parents[2]
    documents = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    text = "\n".join(d.read_text() for d in documents).replace("\\\n", " ")
    (command,) = re.findall(rf"^freeatten-compile --target={target} --config=\S+:gpt2_small.*$", text, flags=re.M)
    return shlex.split(command)[1:]


def _lowered_only(monkeypatch) -> list:
    """Stop freeatten-compile after lowering (XLA's compile of a whole step takes minutes); the programs it lowered."""
    lowered = []

    def lower_only(lower, target, hbm_knob=run.STEP_HBM_KNOB):
        lowered.append(lower())
        return run.Report(target, 0, 0, 0, 0, targets.parse(target).hbm_bytes, 0, ())

    monkeypatch.setattr(run, "compile_report", lower_only)
    return lowered


def test_the_readmes_million_token_command_lowers_the_kernels_on_each_chips_chunk(run_cli, monkeypatch):
    """The v5p-32 command of docs/context_parallel.md (--context=16 --seq_len=1048576): every kernel call (LSSAR's two
    passes, dq, dkv, one block instead of 12) on the chip's 65,536 tokens."""
    lowered = _lowered_only(monkeypatch)
    code, lines = run_cli(compile_cli.main, *_readme_command("v5p-32"), "--config.model.num_layers=1")
    assert code == 0 and lines[-2].startswith("target v5p-32: per device"), lines
    text = lowered[0].as_text()
    assert text.count("tpu_custom_call") == 10 and "tensor<1x12x65536x64xbf16>" in text  # 2 x 2 passes (remat), each 2 calls
    assert "1048576x64" not in text


def test_the_readmes_compile_command_needs_no_data(run_cli, monkeypatch):
    """The `freeatten-compile --config=lssar:gpt2_small ...` of docs/training.md (.bin shards, no data.path) gets to a
    lowered program, its kernels on each chip's share of the documented batch. The test adds one block instead of 12
    and stops before XLA's compile (half a minute to fail for HBM, two to fit), which the tests above run on tiny."""
    lowered = _lowered_only(monkeypatch)
    code, lines = run_cli(compile_cli.main, *_readme_command("v5p-8"), "--config.model.num_layers=1")
    assert code == 0 and lines[-2].startswith("target v5p-8: per device"), lines
    text = lowered[0].as_text()
    assert text.count("tpu_custom_call") == 3 and "tensor<128x12x1024x64xbf16>" in text, text[:2000]


@pytest.mark.parametrize("target", ["v5e-8", "h100"])
def test_auto_runs_the_platforms_kernels_above_the_references_size(target):
    """attend's default implementation ("auto") at T = 4096 compiles to the platform's three kernels (forward, dq,
    dK/dV) for LSSA, as context_parallel_attend's "auto" runs them round the ring."""
    report = compile_attention(target, variant="lssa", seq_len=4096, heads=2, implementation="auto")
    assert report.kernels == 3


def test_auto_runs_the_kernels_in_the_models_training_step(run_cli, monkeypatch):
    """The model with its default implementation ("auto") at 4,096 tokens lowers its attention to the TPU kernels."""
    lowered = _lowered_only(monkeypatch)
    flags = ("--config.model.num_layers=1", "--seq_len=4096", "--config.train.batch_size=8")
    code, lines = run_cli(compile_cli.main, "--target=v5p-8", "--config=lssa:gpt2_small", *flags)
    assert code == 0, lines
    assert lowered[0].as_text().count("tpu_custom_call") == 3


def test_a_tpu_target_compiles_without_libtpus_start_up_lines_on_a_host_without_chips():
    """libtpu asks the cloud's metadata server for its workers and, on a host without chips, prints 7 lines (an E0000
    INVALID_ARGUMENT among them) before every deviceless compile; instead one line says what was silenced."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
    code = "from freeatten_jax.compile import targets; print(len(targets.devices('v5e-8')))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.split() == ["8"], result.stderr[-2000:]
    assert result.stderr.splitlines() == [
        "note: no TPU on this host: libtpu told it is one host of its own (its start-up lines silenced)"
    ], result.stderr[-2000:]


def test_a_users_script_starts_jax_without_the_plugins_start_up_noise():
    """With the [compile] extra installed and JAX_PLATFORMS unset, jax's first use on a host without chips printed a
    25-line "Unable to load cuDNN" traceback and libtpu's 7 lines; after the script's opt-in
    `quiet_plugins.quiet_platforms()` (which sets JAX_PLATFORMS=cpu there) nothing, and jax runs on the CPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_") and k != "JAX_PLATFORMS"}
    code = "import jax\nfrom freeatten_jax import quiet_plugins\n"
    code += "quiet_plugins.quiet_platforms()\nprint(jax.devices()[0].platform)"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.split() == ["cpu"] and result.stderr == "", result.stderr[-2000:]
