"""training/warm_start.py (config.init.path): a new run from a trained run's weights with another attention. Its step-0
model holds the source's parameters and the documented new ones, scores what the source scores with the new attention
switched in at eval time, resumes exactly after kill -9 without its source, and bad sources are one error line that
writes nothing."""

import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from flax import nnx
from helpers import WORDS, read_metrics, subprocess_env, tiny_config

from freeatten_jax import data
from freeatten_jax.cli import train as train_cli
from freeatten_jax.configs import base
from freeatten_jax.errors import ConfigError, UserError
from freeatten_jax.evaluation import loss, suite
from freeatten_jax.nn import sharding
from freeatten_jax.training import config, loop, optim, run_dir, warm_start
from freeatten_jax.training import state as train_state
from freeatten_jax.training.run_dir import load_run

SOURCE_STEPS = {"train.steps": 6, "train.checkpoint_every": 3, "optim.schedule": "constant", "train.eval_every": 100}
WARM_STEPS = {"train.steps": 4, "train.checkpoint_every": 2, "optim.schedule": "constant", "train.eval_every": 100}


@pytest.fixture(scope="module")
def source(text_glob, trained_run):
    """A softmax run trained to step 6 (checkpoints 3 and 6)."""
    return trained_run("warm-source-softmax", tiny_config("softmax", text_glob, **SOURCE_STEPS))


def _warm(variant, text_glob, source, **overrides):
    return tiny_config(variant, text_glob, **{**WARM_STEPS, "init.path": str(source), **overrides})


def _params(model) -> dict:
    return {name: np.asarray(a) for name, a in warm_start.flat_params(model).items()}


def _switched(model, variant: str, s: float | None):
    """The source model with `variant` switched in at eval time: SSMax gets a per-head s in every layer (its only
    parameter a softmax model lacks), the others take no parameter."""
    for layer in model.attention_layers:
        if variant == "ssmax":
            layer.s_H = nnx.Param(jnp.full((layer.wq_EHD.shape[1],), s))
        layer.set_attention(variant)
    return model


@pytest.mark.parametrize("variant", ["ssmax"])  # through the loop; lssar (no new parameter) below, directly
def test_a_warm_start_holds_the_sources_weights_at_step_0_and_scores_as_the_switched_source(variant, source, text_glob, tmp_path):
    workdir = tmp_path / "warm"
    rows = loop.train_and_evaluate(_warm(variant, text_glob, source, **{"train.seq_len": 32}), workdir)  # source: 16
    start, src = load_run(workdir, step=0), load_run(source)
    assert start.step == 0 and start.config.init.path == str(source) and start.config.model.attention == variant
    ours, theirs = _params(start.model), _params(src.model)
    new = {name: value for name, value in ours.items() if name not in theirs}
    assert set(theirs) <= set(ours) and len(theirs) == 13
    for name, value in theirs.items():
        assert np.array_equal(ours[name], value), name
    s0 = 1 / math.log(16)  # s log N = 1 at the source's training length (its train.seq_len), not this run's
    assert sorted(new) == (["blocks.0.attn.s_H"] if variant == "ssmax" else [])
    for value in new.values():
        np.testing.assert_allclose(value, s0, rtol=1e-6)
    record = json.loads((workdir / run_dir.INIT_FILE).read_text())
    assert record["source"] == f"{source}@6" and record["training_length"] == 16 and record["copied"] == 13

    splits = data.load_splits(src.config.data)
    windows_WL = data.held_out_windows(src.config.data, splits, 16, 16)
    expected_WT = loss.token_losses(_switched(src.model, variant, s0), windows_WL)
    got_WT = loss.token_losses(start.model, windows_WL)
    np.testing.assert_allclose(got_WT, expected_WT, rtol=1e-5, atol=1e-6)
    as_trained = loss.token_losses(load_run(source).model, windows_WL)
    assert variant == "lssar" or np.abs(as_trained - got_WT).max() > 1e-4  # the switch changes the scores
    # the suite evaluates one of its checkpoints (WORKDIR@STEP), named with its origin, apart from runs from scratch
    settings = suite.Settings(multipliers=(1,), eval_tokens=4 * 33, passkey_depths=())
    at_0, at_4 = suite.run_suite([f"{workdir}@0", str(workdir)], [], settings, str(tmp_path / "eval"))
    assert (at_0.name, at_0.step, at_0.variant) == ("warm@0", 0, f"{variant} from softmax@6 +0")
    assert (at_4.name, at_4.step, at_4.variant) == ("warm", 4, f"{variant} from softmax@6 +4")
    expected = loss.token_losses(start.model, loss.span_windows(splits.val, 32, 4 * 33)).mean()
    assert at_0.at(1).loss == pytest.approx(float(expected), rel=1e-5) != at_4.at(1).loss
    with pytest.raises(UserError, match=r"--workdir=.*warm@9: no checkpoint step 9; it has: \[0, 2, 4\]"):
        suite.run_suite([f"{workdir}@9"], [], settings, str(tmp_path / "eval"))
    # a new run: its own schedule from step 1 (warm-up from 0), and it trains on
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    warmup = optim.schedule(start.config.optim, start.config.train.steps)
    assert [r["lr"] for r in rows[:2]] == [float(warmup(0)), float(warmup(1))] and rows[0]["lr"] == 0.0
    assert np.isfinite([r["loss"] for r in rows]).all()


def test_a_warm_start_into_lssar_copies_every_source_parameter_and_scores_as_the_switched_source(source, text_glob, tmp_path):
    """warm_start.apply on a fresh LSSAR state (the loop's step-0 state, without the loop): LSSAR takes no parameter a
    softmax model lacks, so every parameter is the source's, and the model scores what the source scores with LSSAR."""
    cfg = config.parse(_warm("lssar", text_glob, source, **{"train.seq_len": 32}))
    mesh = sharding.make_mesh(cfg.mesh.shape, jax.devices()[:1])
    tx = optim.make(cfg.optim, cfg.train.steps)
    state = train_state.create(cfg, mesh, tx, train_state.abstract_state(cfg, mesh, tx)[1])
    splits = data.load_splits(cfg.data)
    state = warm_start.apply(cfg, state, warm_start.checked_source(cfg, splits.tokenizer), tmp_path)
    warm, src = train_state.model_of(train_state.graphdefs(cfg.model)[1], state), load_run(source).model
    ours, theirs = _params(warm), _params(src)
    assert sorted(ours) == sorted(theirs) and len(theirs) == 13
    for name, value in theirs.items():
        assert np.array_equal(ours[name], value), name
    record = json.loads((tmp_path / run_dir.INIT_FILE).read_text())
    assert (record["source"], record["copied"], record["new"], record["dropped"]) == (f"{source}@6", 13, {}, [])
    windows_WL = data.held_out_windows(cfg.data, splits, 16, 16)
    np.testing.assert_allclose(
        loss.token_losses(warm, windows_WL), loss.token_losses(_switched(src, "lssar", None), windows_WL), rtol=1e-5, atol=1e-6
    )


def test_the_lm_config_takes_a_sources_sizes_tokenizer_and_length(source, text_glob):
    cfg = base.get_config("lssar", "tiny", init=str(source))
    assert (cfg.model.num_layers, cfg.model.d_model, cfg.model.num_heads, cfg.model.mlp_dim) == (1, 32, 2, 64)
    assert (cfg.model.vocab_size, cfg.model.attention, cfg.train.seq_len, cfg.init.path) == (256, "lssar", 16, str(source))
    assert (cfg.data.source, cfg.data.path, cfg.data.tokenizer) == ("text", text_glob, "byte")


# --- kill -9 -----------------------------------------------------------------------------------------------------

_CHILD = """
import sys, time
sys.path.insert(0, "tests")
from helpers import tiny_config
from freeatten_jax.training import distributed, loop
fetch, calls = distributed.host_local_batch_to_global, []
def fetch_and_wait(*args):  # waits while fetching batch 2 (checkpoint 0 only is saved), for the parent's SIGKILL
    calls.append(1)
    if len(calls) == 2:
        print("waiting", flush=True)
        time.sleep(600)
    return fetch(*args)
distributed.host_local_batch_to_global = fetch_and_wait
cfg = tiny_config("ssmax", sys.argv[2], **{**dict(WARM_STEPS), "init.path": sys.argv[3]})
loop.train_and_evaluate(cfg, sys.argv[1])
""".replace("WARM_STEPS", repr(WARM_STEPS))


@pytest.mark.slow
def test_a_warm_start_killed_before_its_first_checkpoint_resumes_exactly_without_its_source(source, text_glob, tmp_path):
    moved = tmp_path / "source"
    shutil.copytree(source, moved)
    loop.train_and_evaluate(_warm("ssmax", text_glob, moved), tmp_path / "straight")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path / "killed"), text_glob, str(moved)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert "waiting" in iter(lambda: child.stdout.readline().strip(), "")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    shutil.rmtree(moved)  # checkpoint 0 holds the warm start: the source is no longer needed
    loop.train_and_evaluate(_warm("ssmax", text_glob, moved), tmp_path / "killed")
    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "killed")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert [(r["loss"], r.get("val_loss")) for r in resumed] == [(r["loss"], r.get("val_loss")) for r in straight]


# --- bad sources: one `error:` line, nothing written ---------------------------------------------------------------


def _args(source, text_glob, workdir, **overrides) -> list[str]:
    cfg = {
        "model.num_layers": 1,
        "model.d_model": 32,
        "model.num_heads": 2,
        "model.mlp_dim": 64,
        "data.source": "text",
        "data.path": text_glob,
        "train.seq_len": 16,
        "train.batch_size": 8,
        "train.steps": 2,
        "mesh.shape": "(1,1,1)",
        "init.path": str(source),
        **overrides,
    }
    return ["--config=ssmax:tiny", f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in cfg.items())]


BAD = {  # config overrides -> what the one line must say
    "no such source": ({"init.path": "{tmp}/nowhere"}, "config.init.path={tmp}/nowhere: no checkpoint in"),
    "a step not saved": ({"init.path": "{source}@4"}, "has no checkpoint step 4; it has: 3, 6"),
    "another width": (
        {"model.d_model": 64},
        "parameter blocks.0.attn.wk_EKD is (32, 2, 16) in the source but (64, 2, 32) in this run's model",
    ),
    "another depth": ({"model.num_layers": 2}, "parameter blocks.1.attn.wk_EKD is only in this run's model"),
    "untied": ({"model.tie_embeddings": False}, "parameter unembed_EV is only in this run's model"),
    "another vocabulary": (
        {"data.document_masking": "on"},
        "its vocabulary has 256 tokens but this run's has 257 (model.vocab_size, the data's tokenizer)",
    ),
    "another tokenizer": (
        {"data.tokenizer": "file", "data.tokenizer_path": "{tmp}/words.json", "model.vocab_size": 256},
        "this run's data tokenizer (data.tokenizer=file) is not the source's",
    ),
}


def test_a_workdir_holding_another_run_is_refused(source, text_glob, tmp_path):
    """The source recorded in a run's config is part of it, as its model and data are: a warm start into a workdir
    that holds a run from scratch (or from another source) is refused, not resumed."""
    shutil.copytree(source, tmp_path / "run")
    with pytest.raises(ConfigError, match=f"config.init.path is '{source}' but the checkpoint at step 6 in .* used ''"):
        loop.train_and_evaluate(tiny_config("softmax", text_glob, **{**SOURCE_STEPS, "init.path": str(source)}), tmp_path / "run")


def _files(folder) -> dict:
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_warm_start_source_is_one_error_line_and_writes_nothing(case, source, text_glob, run_cli, tmp_path):
    overrides, expected = BAD[case]
    paths = {"tmp": tmp_path, "source": source}
    overrides = {k: v.format(**paths) if isinstance(v, str) else v for k, v in overrides.items()}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS + ["[UNK]"])}, "[UNK]"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    (tmp_path / "words.json").write_text(words.to_str())  # 20 tokens: fits the vocabulary, yet is not the source's
    before = _files(tmp_path), _files(source)
    code, lines = run_cli(train_cli.main, *_args(source, text_glob, tmp_path / "run", **overrides))
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and expected.format(**paths) in lines[0], lines
    assert (_files(tmp_path), _files(source)) == before and not (tmp_path / "run").exists()


def test_a_warm_start_by_the_lm_configs_init_argument_prints_no_logging_notices(source, tmp_path):
    """`--config=lm:variant=lssar,init=RUN` reads the source while the config loads, before absl's flags are parsed:
    no 'Logging before flag parsing' line and no orbax read-only notice, as with --config.init.path."""
    train = pathlib.Path(sys.executable).parent / "freeatten-train"
    command = [str(train), f"--config=lm:variant=lssar,init={source}", f"--workdir={tmp_path / 'run'}"]
    command += ["--config.train.steps=1", "--config.train.batch_size=8", "--config.mesh.shape=(1,1,1)"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=subprocess_env(1))
    assert result.returncode == 0, result.stderr[-2000:]
    notices = [line for line in result.stderr.splitlines() if "flag parsing" in line or "read_only" in line]
    assert notices == [] and read_metrics(tmp_path / "run")[-1]["step"] == 1
