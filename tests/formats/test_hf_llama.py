"""Hugging Face Llama import against an independent implementation: a tiny random `FlaxLlamaForCausalLM`
(transformers, test-only; GQA, untied), written by the test in the Hub's layout (torch names, [out, in] weights, one
safetensors file or two shards with their index), imported with freeatten-import, gives the same logits and the same
greedy tokens; a RoPE base other than 10,000 and RoPE scaling (linear, llama3), which FlaxLlama ignores, against the
reference given those frequencies, in config.json's layouts of transformers 4 (rope_theta, rope_scaling) and 5
(rope_parameters); the import trains on with LSSAR; unsupported or broken folders are one error line that writes nothing.
"""

import json
import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import HUB, hf_inverse_frequencies, hub_tokenizer, read_metrics, write_hub_folder
from safetensors.numpy import save_file
from transformers import FlaxLlamaForCausalLM, LlamaConfig
from transformers.models.llama import modeling_flax_llama

from freeatten_jax.cli import evaluate as eval_cli
from freeatten_jax.cli import generate as generate_cli
from freeatten_jax.cli import import_hf as import_cli
from freeatten_jax.configs import base
from freeatten_jax.evaluation import suite
from freeatten_jax.formats import hf_llama
from freeatten_jax.nn import generate
from freeatten_jax.training import loop
from freeatten_jax.training.run_dir import load_run

PROMPT = "the king and the queen"


@pytest.fixture(scope="module")
def hub(text_glob, tmp_path_factory):
    """(the reference FlaxLlama, its tokenizer, its Hub folder in one file, and in two shards)."""
    tok = hub_tokenizer(text_glob)
    reference = FlaxLlamaForCausalLM(LlamaConfig(vocab_size=tok.get_vocab_size(), **HUB), seed=0)
    root = tmp_path_factory.mktemp("hub")
    return (
        reference,
        tok,
        write_hub_folder(root / "single", reference, tok),
        write_hub_folder(root / "sharded", reference, tok, 2),
    )


def _on_text(text_glob) -> list[str]:
    """Config overrides: the test corpus as the run's data (the default corpus is fetched on first use)."""
    return ["--config.mesh.shape=(1,1,1)", "--config.data.source=text", f"--config.data.path={text_glob}"]


def _import(run_cli, folder, workdir, text_glob):
    code, lines = run_cli(import_cli.main, str(folder), f"--workdir={workdir}", *_on_text(text_glob))
    assert code == 0, lines
    return lines


@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_an_imported_llama_gives_the_references_logits_and_greedy_tokens(layout, hub, run_cli, text_glob, tmp_path):
    reference, tok, single, sharded = hub
    lines = _import(run_cli, {"single": single, "sharded": sharded}[layout], tmp_path / "run", text_glob)
    assert lines[-1] == f"imported {single if layout == 'single' else sharded} as checkpoint 0 of {tmp_path / 'run'}"
    run = load_run(tmp_path / "run")
    assert (run.step, run.config.model.num_kv_heads, run.config.model.norm_eps, run.config.train.seq_len) == (0, 2, 1e-5, 64)
    tokens_BT = np.asarray([tok.encode(PROMPT + " and the lord").ids] * 2, np.int32)
    tokens_BT[1] = tokens_BT[1][::-1]
    ours_BTV, theirs_BTV = np.asarray(run.model(tokens_BT)), np.asarray(reference(tokens_BT).logits)
    error = float(np.abs(ours_BTV - theirs_BTV).max())
    print(f"max |logit difference| vs FlaxLlamaForCausalLM ({layout}): {error:.2e}")
    assert error <= 1e-4 and np.abs(theirs_BTV).max() > 1e-2

    # greedy tokens: the reference, fed our continuation, picks each of our tokens next (as its own greedy decoding
    # would, short of a tie; one forward pass instead of compiling its decoding loop)
    prompt_BT = np.asarray([tok.encode(PROMPT).ids], np.int32)
    ours_BT, p = np.asarray(generate(run.model, prompt_BT, 12, temperature=0.0)), prompt_BT.shape[1]
    theirs_next_BT = np.asarray(reference(ours_BT[:, :-1]).logits).argmax(-1)[:, p - 1 :]
    assert theirs_next_BT.tolist() == ours_BT[:, p:].tolist()
    code, lines = run_cli(
        generate_cli.main, f"--workdir={tmp_path / 'run'}", f"--prompt={PROMPT}", "--max_new_tokens=12", "--temperature=0"
    )
    assert code == 0 and lines[0] == PROMPT + tok.decode(ours_BT[0, p:].tolist()), lines


def _sincos(inv_freq_F):
    """FlaxLlama's table of RoPE sines and cosines ([positions, 1, sin | cos of D angles]) for these inverse frequencies."""

    def sincos(num_pos, dim):
        angle_PF = np.arange(num_pos)[:, None] * inv_freq_F
        angle_PD = np.concatenate([angle_PF, angle_PF], -1).astype(np.float32)
        return jnp.asarray(np.concatenate([np.sin(angle_PD), np.cos(angle_PD)], -1)[:, None])

    return sincos


def _reference_logits(reference, tokens_BT, monkeypatch, rope: dict):
    """The reference's logits with the inverse frequencies of `rope` (config.json's rope_parameters), which FlaxLlama
    itself never reads (it always uses 10,000 and no scaling)."""
    head_dim = reference.config.hidden_size // reference.config.num_attention_heads
    monkeypatch.setattr(modeling_flax_llama, "create_sinusoidal_positions", _sincos(hf_inverse_frequencies(head_dim, **rope)))
    model = FlaxLlamaForCausalLM(reference.config, seed=0, _do_init=False)
    return np.asarray(model(tokens_BT, params=reference.params).logits)


def _rope_in_layout(rope: dict, layout: str) -> dict:
    """config.json's RoPE keys for `rope` (rope_theta, rope_type and the scaling's fields) as transformers `layout`
    writes them: "5" rope_parameters alone; "4" rope_theta and rope_scaling (None unscaled); "4, type" the same with
    rope_type under its older name."""
    if layout == "5":
        return {"rope_parameters": rope}
    fields = {k: v for k, v in rope.items() if k not in ("rope_theta", "rope_type")}
    type_key = "type" if layout == "4, type" else "rope_type"
    scaled = rope.get("rope_type", "default") != "default"
    return {"rope_theta": rope["rope_theta"], "rope_scaling": {type_key: rope["rope_type"], **fields} if scaled else None}


def _hub_with_rope(single, folder, rope: dict, layout: str):
    """A copy of the reference's Hub folder whose config.json has `rope` in `layout` (no other RoPE key)."""
    shutil.copytree(single, folder)
    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in ("rope_theta", "rope_scaling", "rope_parameters")}
    (folder / "config.json").write_text(json.dumps({**config, **_rope_in_layout(rope, layout)}))
    return folder


@pytest.mark.parametrize("layout", ["4", "5"])
def test_a_rope_base_other_than_10000_is_imported(layout, hub, run_cli, text_glob, tmp_path, monkeypatch):
    """config.json's RoPE base, top-level (transformers 4) or in rope_parameters (5), reaches every layer: the logits
    equal the reference's with its sines for that base, and differ from those at 10,000."""
    reference, tok, single, _ = hub
    rope = {"rope_theta": 500_000.0, "rope_type": "default"}
    _import(run_cli, _hub_with_rope(single, tmp_path / "hub", rope, layout), tmp_path / "run", text_glob)
    run = load_run(tmp_path / "run")
    tokens_BT = np.asarray([tok.encode(PROMPT + " and the lord of the night").ids], np.int32)
    at_10000 = np.asarray(reference(tokens_BT).logits)
    at_500000 = _reference_logits(reference, tokens_BT, monkeypatch, rope)
    ours = np.asarray(run.model(tokens_BT))
    assert np.abs(ours - at_500000).max() <= 1e-4 < np.abs(ours - at_10000).max()


# Each scaling in the layout it is read from: Llama 3.1's with a length before scaling at which the reference's
# wavelengths (D = 8, theta 500,000: 6, 167, 4,443 and 118,379) fall in each of llama3's bands (< 64, 64..256, > 256)
SCALED = {
    "linear": ({"rope_theta": 500_000.0, "rope_type": "linear", "factor": 4.0}, "4, type"),
    "llama3": (
        {
            "rope_theta": 500_000.0,
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        "5",
    ),
}


@pytest.mark.parametrize("scaling", SCALED)
def test_rope_scaling_is_imported(scaling, hub, run_cli, text_glob, tmp_path, monkeypatch):
    """A checkpoint's RoPE scaling reaches the run's config and every layer: the logits equal the reference's with
    Hugging Face's scaled frequencies, and differ from the unscaled ones at the same base."""
    reference, tok, single, _ = hub
    rope, layout = SCALED[scaling]
    _import(run_cli, _hub_with_rope(single, tmp_path / "hub", rope, layout), tmp_path / "run", text_glob)
    run = load_run(tmp_path / "run")
    assert (run.config.model.rope_scaling, run.config.model.rope_factor) == (scaling, rope["factor"])
    tokens_BT = np.asarray([tok.encode(PROMPT + " and the lord of the night").ids], np.int32)
    scaled = _reference_logits(reference, tokens_BT, monkeypatch, rope)
    unscaled = _reference_logits(reference, tokens_BT, monkeypatch, {"rope_theta": rope["rope_theta"]})
    ours = np.asarray(run.model(tokens_BT))
    assert np.abs(ours - scaled).max() <= 1e-4 < np.abs(ours - unscaled).max()


LLAMA3 = SCALED["llama3"][0]
# config.json's RoPE keys -> the model's rope_* fields, as transformers 5 reads them (checked against it by hand)
ROPE_READINGS = {
    "nothing: 10,000": ({}, dict(rope_theta=10_000.0, rope_scaling="none")),
    "4: rope_theta": ({"rope_theta": 1e6, "rope_scaling": None}, dict(rope_theta=1e6, rope_scaling="none")),
    "5: rope_parameters without a base: 10,000": (
        {"rope_parameters": {"rope_type": "linear", "factor": 2}},
        dict(rope_theta=10_000.0, rope_scaling="linear", rope_factor=2.0),
    ),
    "5: its own base over a top-level one": (
        {"rope_theta": 1e3, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}},
        dict(rope_theta=1e6, rope_scaling="none"),
    ),
    "4 and 5: rope_scaling over rope_parameters": (
        {"rope_theta": 1e3, "rope_scaling": {"type": "linear", "factor": 3}, "rope_parameters": {"rope_theta": 1e6}},
        dict(rope_theta=1e3, rope_scaling="linear", rope_factor=3.0),
    ),
    "4: llama3": (
        _rope_in_layout(LLAMA3, "4"),
        dict(rope_theta=5e5, rope_scaling="llama3", rope_factor=8.0, rope_original_len=256),
    ),
    "5: llama3 without its length before scaling: max_position_embeddings": (
        {"rope_parameters": {k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"}},
        dict(rope_theta=5e5, rope_scaling="llama3", rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_len=64),
    ),
}


@pytest.mark.parametrize("case", ROPE_READINGS)
def test_config_jsons_rope_is_read_as_transformers_5_reads_it(case, hub, tmp_path):
    keys, expected = ROPE_READINGS[case]
    shutil.copytree(hub[2], tmp_path / "hub")
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in ("rope_theta", "rope_scaling", "rope_parameters")}
    (tmp_path / "hub" / "config.json").write_text(json.dumps({**config, **keys}))
    model = hf_llama.open_checkpoint(tmp_path / "hub").model
    assert {name: getattr(model, name) for name in expected} == expected


TRAIN_ON = {
    "train.seq_len": 32,
    "train.batch_size": 8,
    "train.steps": 8,
    "train.log_every": 1,
    "train.eval_every": 4,
    "train.eval_windows": 16,
    "optim.lr": 3e-3,
    "optim.warmup_steps": 2,
    "mesh.shape": (1, 1, 1),
}


def test_an_imported_llama_trains_on_with_lssar_and_the_loss_falls(hub, text_glob, tmp_path):
    _, _, single, _ = hub
    cfg = base.get_config("lssar", "tiny", init=str(single))  # the model's sizes and tokenizer, this run's attention
    cfg.update_from_flattened_dict({**TRAIN_ON, "data.source": "text", "data.path": text_glob})
    loop.train_and_evaluate(cfg, tmp_path / "run")
    rows = read_metrics(tmp_path / "run")
    assert load_run(tmp_path / "run", step=0).config.model.attention == "lssar"
    assert rows[-1]["loss"] < rows[0]["loss"] and rows[-1]["val_loss"] < rows[3]["val_loss"], rows


def test_a_run_started_from_an_import_keeps_the_hub_models_name_and_is_reported_per_token(hub, run_cli, text_glob, tmp_path):
    """freeatten-import, then LSSAR from the imported run: the report names the Hub model (through the import's own
    origin), and its losses are per token (the Hub tokenizer's), not per byte."""
    _, _, single, _ = hub
    _import(run_cli, single, tmp_path / "imported", text_glob)
    cfg = base.get_config("lssar", "tiny", init=str(tmp_path / "imported"))
    on_text = {"data.source": "text", "data.path": text_glob, "train.steps": 2, "train.eval_every": 2}
    cfg.update_from_flattened_dict({**TRAIN_ON, **on_text})
    loop.train_and_evaluate(cfg, tmp_path / "lssar")
    settings = suite.Settings(multipliers=(1,), eval_tokens=2 * 33, passkey_depths=())
    workdirs = [str(tmp_path / "imported"), str(tmp_path / "lssar")]
    imported, started = suite.run_suite(workdirs, [], settings, str(tmp_path / "out"))
    assert imported.variant == "softmax from single +0" and started.variant == "lssar from softmax@0 (single) +2"
    assert imported.loss_unit == started.loss_unit == "nats per token"
    assert "(mean next-token loss, nats per token, [95%" in (tmp_path / "out" / "report.md").read_text()


# --- unsupported or broken folders: one `error:` line, nothing written ----------------------------------------------


def _edit_config(**changes):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))

    return edit


def _save_tensors(folder, change):
    from safetensors.numpy import load_file

    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors")


BROKEN = {  # how the folder is broken -> what the one line must say
    "no config.json": (lambda f: (f / "config.json").unlink(), "config.json not found"),
    "no weights": (
        lambda f: (f / "model.safetensors").unlink(),
        "has neither model.safetensors nor model.safetensors.index.json",
    ),
    "no tokenizer": (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json not found"),
    "gpt2": (_edit_config(architectures=["GPT2LMHeadModel"]), "architecture 'GPT2LMHeadModel' is not supported"),
    "yarn rope scaling (transformers 4)": (
        _edit_config(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
        "rope_type 'yarn' (RoPE scaling other than default, linear, llama3) is not supported",
    ),
    "dynamic rope scaling (transformers 5)": (
        _edit_config(rope_parameters={"rope_theta": 1e4, "rope_type": "dynamic", "factor": 2.0}),
        "rope_type 'dynamic' (RoPE scaling other than default, linear, llama3) is not supported",
    ),
    "llama3 without its fields": (
        _edit_config(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
        "RoPE scaling 'llama3' lacks 'low_freq_factor'",
    ),
    "partial rotary": (_edit_config(partial_rotary_factor=0.5), "partial_rotary_factor other than 1 (RoPE on part of each head)"),
    "attention biases": (_edit_config(attention_bias=True), "attention_bias=true (biases in q/k/v/o) is not supported"),
    "a shape mismatch": (
        _edit_config(intermediate_size=64),
        "model.layers.0.mlp.down_proj.weight has shape (32, 48) but config.json implies (32, 64)",
    ),
    "a missing tensor": (
        lambda f: _save_tensors(f, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
        "tensor 'model.layers.1.mlp.up_proj.weight' is missing",
    ),
    "a bias tensor": (
        lambda f: _save_tensors(f, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)})),
        "tensor 'model.layers.0.self_attn.q_proj.bias' has no place in a 2-layer Llama without biases",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_an_unsupported_or_broken_folder_is_one_error_line_and_writes_nothing(case, hub, run_cli, text_glob, tmp_path):
    break_it, expected = BROKEN[case]
    shutil.copytree(hub[2], tmp_path / "hub")
    break_it(tmp_path / "hub")
    before = {str(p): p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    code, lines = run_cli(import_cli.main, str(tmp_path / "hub"), f"--workdir={tmp_path / 'run'}", *_on_text(text_glob))
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'hub'}") and expected in lines[0], lines
    assert "config.init.path" not in lines[0]  # a field the user of freeatten-import never set
    assert {str(p): p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before and not (tmp_path / "run").exists()


def test_a_refused_override_names_the_folder_not_config_init_path(hub, run_cli, text_glob, tmp_path):
    """An override the Hub model cannot take (another tokenizer): the line names HF_DIR, as the user gave it."""
    args = [str(hub[2]), f"--workdir={tmp_path / 'run'}", *_on_text(text_glob), "--config.data.tokenizer=byte"]
    code, lines = run_cli(import_cli.main, *args)
    expected = f"error: {hub[2]}: this run's data tokenizer (data.tokenizer=byte) is not the source's"
    assert code == 1 and len(lines) == 1 and lines[0].startswith(expected), lines


def test_head_dim_null_and_a_llamas_sliding_window_are_read_as_transformers_reads_them(hub, tmp_path):
    """`"head_dim": null` (transformers 4.57 writes it for Mistral) is hidden_size / num_attention_heads; LlamaModel never
    reads sliding_window, nor does the import (Mistral's is its window)."""
    shutil.copytree(hub[2], tmp_path / "hub")
    _edit_config(head_dim=None, sliding_window=16)(tmp_path / "hub")
    model = hf_llama.open_checkpoint(tmp_path / "hub").model
    assert (model.d_model // model.num_heads, model.window) == (8, None)


def test_a_missing_shard_is_one_error_line(hub, run_cli, text_glob, tmp_path):
    shutil.copytree(hub[3], tmp_path / "hub")
    (tmp_path / "hub" / "model-00002-of-00002.safetensors").unlink()
    code, lines = run_cli(import_cli.main, str(tmp_path / "hub"), f"--workdir={tmp_path / 'run'}", *_on_text(text_glob))
    shard = tmp_path / "hub" / "model-00002-of-00002.safetensors"
    assert code == 1 and len(lines) == 1 and f"{shard} not found (model.safetensors.index.json names it)" in lines[0], lines


def test_a_hub_folder_given_as_a_run_says_to_import_it_first(hub, run_cli, tmp_path):
    """freeatten-eval and freeatten-generate of a Hub folder not imported yet: one line naming the command that imports
    it, and nothing written in it."""
    folder = shutil.copytree(hub[2], tmp_path / "hub")
    before = {str(p): p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    expected = (
        f"error: {folder} is a Hugging Face checkpoint folder, not a run: import it first with "
        f"freeatten-import {folder} --workdir=WORKDIR"
    )
    for main, args in [(eval_cli.main, [f"--out={tmp_path / 'out'}"]), (generate_cli.main, ["--prompt=the"])]:
        assert run_cli(main, f"--workdir={folder}", *args) == (1, [expected])
    assert {str(p): p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


@pytest.mark.parametrize("script", ["evaluate", "import_"])
def test_the_console_commands_print_one_line_for_a_hub_folder_not_imported_or_a_missing_one(script, hub, tmp_path):
    """As a user runs them (a process of its own: absl's and orbax's log lines reach its stderr): freeatten-eval of a Hub
    folder not imported and freeatten-import of a folder that does not exist print their error line and nothing else."""
    folder = shutil.copytree(hub[2], tmp_path / "hub")
    args = {
        "evaluate": [f"--workdir={folder}", f"--out={tmp_path / 'out'}"],
        "import_": [str(tmp_path / "nowhere"), f"--workdir={tmp_path / 'run'}"],
    }[script]
    expected = {
        "evaluate": f"error: {folder} is a Hugging Face checkpoint folder, not a run: import it first with "
        f"freeatten-import {folder} --workdir=WORKDIR",
        "import_": f"error: {tmp_path / 'nowhere'} does not exist: give a Hugging Face model folder (config.json, "
        "model.safetensors)",
    }[script]
    code = f"from freeatten_jax.cli import scripts; scripts.{script}()"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert (result.returncode, result.stdout, result.stderr) == (1, "", expected + "\n")


def test_importing_a_folder_that_does_not_exist_is_one_line(run_cli, text_glob, tmp_path):
    code, lines = run_cli(import_cli.main, str(tmp_path / "nowhere"), f"--workdir={tmp_path / 'run'}", *_on_text(text_glob))
    expected = f"error: {tmp_path / 'nowhere'} does not exist: give a Hugging Face model folder (config.json, model.safetensors)"
    assert (code, lines) == (1, [expected]) and not list(tmp_path.iterdir())
