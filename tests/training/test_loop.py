"""Training: the loop's resume equivalence and traced-once steps, the step's accumulation and meshes, flops, the CLI.
The rooms the loop calls are tested directly in tests/training/."""

import json
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import SigtermAtBatch, read_metrics, tiny_config

from freeatten_jax import data
from freeatten_jax.cli import train as train_cli
from freeatten_jax.nn import sharding
from freeatten_jax.training import checkpoint, config, distributed, loop, optim
from freeatten_jax.training import state as train_state
from freeatten_jax.training import step as train_step


def test_a_second_run_of_the_same_config_in_one_process_reuses_the_traced_steps(text_glob, tmp_path, monkeypatch):
    """Equal configs give equal static arguments (the optimiser and schedule are built once per optim config and
    steps; the fingerprint program once per sharding): the train step and the fingerprints are traced once."""
    from freeatten_jax.training import integrity

    traces = {"train_step": 0, "fingerprints": 0}

    def counting(name, f):
        def traced(*args, **kwargs):
            traces[name] += 1
            return f(*args, **kwargs)

        return traced

    monkeypatch.setattr(train_step, "train_step", counting("train_step", train_step.train_step))
    monkeypatch.setattr(integrity, "bits_sums", counting("fingerprints", integrity.bits_sums))
    shapes_of_its_own = {"model.mlp_dim": 48}  # no other test's state has these shapes, so nothing is traced yet
    cfg = tiny_config(
        "lssa", text_glob, **{"train.steps": 2, "train.checkpoint_every": 2, "train.eval_every": 0, **shapes_of_its_own}
    )
    loop.train_and_evaluate(cfg, tmp_path / "one")
    first = dict(traces)
    loop.train_and_evaluate(cfg, tmp_path / "two")
    assert first["train_step"] == 1 and first["fingerprints"] > 0 and traces == first


@pytest.mark.parametrize("variant", ["softmax", "lssar"])
def test_preempted_and_resumed_run_matches_an_uninterrupted_one(variant, text_glob, tmp_path, monkeypatch):
    cfg = tiny_config(variant, text_glob)
    loop.train_and_evaluate(cfg, tmp_path / "straight")
    monkeypatch.setattr(distributed, "host_local_batch_to_global", SigtermAtBatch(3))
    first = loop.train_and_evaluate(cfg, tmp_path / "resumed")
    assert [m["step"] for m in first] == [1, 2, 3]  # SIGTERM during step 3: step 3 finishes, is saved, the run stops
    assert checkpoint.Checkpointer(tmp_path / "resumed").latest_step() == 3
    monkeypatch.undo()
    second = loop.train_and_evaluate(cfg, tmp_path / "resumed")
    assert [m["step"] for m in second] == [4, 5, 6]
    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [m["step"] for m in resumed] == list(range(1, 7))
    for a, b in zip(straight, resumed):
        assert (a["loss"], a.get("val_loss")) == (b["loss"], b.get("val_loss")), (a, b)
    assert straight[-1]["loss"] < straight[0]["loss"]


def test_gradient_accumulation_matches_one_big_batch(text_glob):
    """Four micro-batches give the one-batch mean loss, gradient norm and update (the learning rate of the
    first step is non-zero, so the parameters move; Adam's first step hardly depends on the gradients'
    scale, so grad_norm is what shows a missing division by the number of micro-batches)."""
    constant = {"optim.warmup_steps": 0, "optim.schedule": "constant"}
    results = []
    for accum in (1, 4):
        cfg = config.parse(tiny_config("softmax", text_glob, **constant, **{"train.grad_accum_steps": accum}))
        assert optim.schedule(cfg.optim, cfg.train.steps)(0) == cfg.optim.lr > 0
        mesh = sharding.make_mesh(cfg.mesh.shape, jax.devices()[:1])
        tokens = data.train_dataset(data.load_splits(cfg.data).train, 16, 8, seed=0)[0]
        tx = optim.make(cfg.optim, cfg.train.steps)
        shardings = train_state.abstract_state(cfg, mesh, tx)[1]
        state = train_state.create(cfg, mesh, tx, shardings)
        initial = jax.tree.map(np.asarray, state["params"])
        results.append(train_step.make_train_step(cfg, shardings)(state, tokens))  # the state is donated: `initial` keeps it
    (s1, m1), (s4, m4) = results
    np.testing.assert_allclose(m1["loss"], m4["loss"], rtol=1e-5)
    np.testing.assert_allclose(m1["grad_norm"], m4["grad_norm"], rtol=1e-4)
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()), s1["params"], initial))
    assert max(moved) > 1e-3
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), s1["params"], s4["params"]
    )  # 1e-3 of a step


def test_sharded_mesh_gives_the_same_losses(text_glob):
    """Three steps over data x fsdp x tensor = 2 x 2 x 2 devices log the losses of one device."""
    losses = {}
    for shape in ((1, 1, 1), (2, 2, 2)):
        cfg = config.parse(tiny_config("lssar", text_glob, **{"train.steps": 3, "mesh.shape": shape}))
        mesh = sharding.make_mesh(cfg.mesh.shape, jax.devices()[: int(np.prod(shape))])
        tx = optim.make(cfg.optim, cfg.train.steps)
        shardings = train_state.abstract_state(cfg, mesh, tx)[1]
        state, step = train_state.create(cfg, mesh, tx, shardings), train_step.make_train_step(cfg, shardings)
        batches = data.train_dataset(data.load_splits(cfg.data).train, 16, 8, seed=0)
        losses[shape] = []
        with sharding.use_mesh(mesh, cfg.mesh.rules):
            for i in range(3):
                tokens = distributed.host_local_batch_to_global(batches[i], mesh, cfg.mesh.rules)
                state, metrics = step(state, tokens)
                losses[shape].append(float(metrics["loss"]))
    np.testing.assert_allclose(losses[(1, 1, 1)], losses[(2, 2, 2)], rtol=1e-5)


def test_train_py_command_line_writes_metrics_and_resumes(text_glob, tmp_path, run_cli):
    """`python train.py` as a user runs it, then its resume (train.py calls the train command's main: in-process)."""
    args = [
        sys.executable,
        "train.py",
        "--config=lm:variant=lssar,size=tiny",
        f"--workdir={tmp_path}",
        "--config.model.num_layers=1",
        "--config.model.d_model=32",
        "--config.model.num_heads=2",
        "--config.model.mlp_dim=64",
        "--config.data.source=text",
        f"--config.data.path={text_glob}",
        "--config.train.seq_len=16",
        "--config.train.batch_size=8",
        "--config.train.log_every=2",
        "--config.train.eval_every=4",
        "--config.train.checkpoint_every=2",
        "--config.mesh.shape=(1,1,1)",
        f"--config.data.cache_dir={tmp_path / 'cache'}",
    ]
    first = subprocess.run([*args, "--config.train.steps=4"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "step 4/4 | loss" in first.stdout and "tok/s" in first.stdout and "ETA" in first.stdout
    code, second = run_cli(train_cli.main, *args[2:], "--config.train.steps=6")
    assert code == 0 and any("steps 5..6" in line for line in second), second[-20:]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [2, 4, 6] and all("loss" in m for m in lines)
    assert [("val_loss" in m) for m in lines] == [False, True, True]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    saved = json.loads(next((tmp_path / "checkpoints" / "6" / "config").glob("*")).read_text())
    assert saved["model"]["attention"] == "lssar" and saved["train"]["steps"] == 6


@pytest.mark.parametrize("overrides", [{}, {"mlp": "swiglu", "tie_embeddings": False, "num_kv_heads": 1}])
def test_flops_count_every_matrix_parameter(overrides):
    """6 N counts each parameter used in a matmul once per token: all matrices but the embedding lookup."""
    from freeatten_jax.nn import Transformer, preset
    from freeatten_jax.training import flops

    cfg = preset("tiny", num_layers=2, d_model=32, num_heads=2, mlp_dim=64, **overrides)
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    matrices = [v for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)) if v.ndim >= 2 and path[0] != "embed_VE"]
    unembedding = cfg.d_model * cfg.vocab_size if cfg.tie_embeddings else 0  # untied: unembed_EV is a matrix above
    assert flops.matrix_params(cfg) == sum(np.prod(v.shape) for v in matrices) + unembedding
    assert flops.train_flops_per_token(cfg, 16) == 6 * flops.matrix_params(cfg) + 6 * 2 * 16 * 32
    assert flops.peak_tflops("TPU v4") == 275.0 and flops.peak_tflops("cpu") is None and flops.peak_tflops("cpu", 2.0) == 2.0
    assert flops.tflops_and_mfu(1e6, 1e6, 2, None) == {"tflops_per_device": 0.5}
    assert flops.tflops_and_mfu(1e6, 1e6, 2, 1.0) == {"tflops_per_device": 0.5, "mfu": 0.5}


def test_a_short_run_says_its_first_step_and_what_its_schedule_misses(text_glob, tmp_path, capsys):
    cfg = tiny_config("softmax", text_glob, **{"train.steps": 3, "train.log_every": 25, "optim.warmup_steps": 50})
    loop.train_and_evaluate(cfg, str(tmp_path / "run"))
    lines = capsys.readouterr().out.splitlines()
    assert (
        "warning: optim.warmup_steps=50 >= train.steps=3: the learning rate peaks at 0.0004 at the last step and never "
        "reaches optim.lr=0.01" in lines
    )
    assert "warning: train.log_every=25 > train.steps=3: only the first and the last step are logged" in lines
    first = [line for line in lines if line.startswith("step 1/3 | loss ")]
    assert len(first) == 1 and re.fullmatch(
        r"step 1/3 \| loss \d+\.\d{4} \| first step in \d+\.\d s \(compilation included\)", first[0]
    )
    assert optim.warnings(config.parse(tiny_config("softmax", text_glob)).optim, 6) == []  # warm-up 2 of 6 steps: silent
