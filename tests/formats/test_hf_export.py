"""freeatten-export: a tiny random `FlaxLlamaForCausalLM` (transformers, test-only; GQA, untied) in the Hub's layout,
imported with freeatten-import and exported again, gives back its tensors bit for bit, its config.json as transformers
reads it (RoPE scaling included), the Hub model's bos/eos in config.json and generation_config.json, and its tokenizer,
and imports again to the same run; a Llama-shaped model trained
here loads in transformers with our logits; LSSAR and SSMax exports keep Llama's tensors and record the attention in
config.json, with a note; a model that is not Llama-shaped, or a folder already holding a model, is one error line that
writes nothing.
"""

import json
import shutil

import numpy as np
import pytest
from helpers import HUB, hub_tokenizer, tiny_config, write_hub_folder
from safetensors.numpy import load_file
from transformers import AutoConfig, FlaxLlamaForCausalLM, GenerationConfig, LlamaConfig, PreTrainedTokenizerFast

from freeatten_jax.cli import export_hf as export_cli
from freeatten_jax.cli import import_hf as import_cli
from freeatten_jax.configs import base
from freeatten_jax.formats import hf_export
from freeatten_jax.training import loop
from freeatten_jax.training.run_dir import load_run
from freeatten_jax.training.warm_start import flat_params

LLAMA3 = {  # Llama 3.1's RoPE scaling, as transformers 4 writes it
    "rope_theta": 500_000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
}
# the config.json fields a LlamaConfig reads that an export must give back
FIELDS = (*(k for k in HUB if k != "architectures"), "vocab_size", "hidden_act", "rope_theta", "rope_scaling", "head_dim")
TEXT = "the king and the queen and the lord of the night"


@pytest.fixture(scope="module")
def hub(text_glob, tmp_path_factory):
    """(the reference FlaxLlama, its tokenizer, its Hub folder; the same with llama3 RoPE scaling)."""
    tok = hub_tokenizer(text_glob)
    reference = FlaxLlamaForCausalLM(LlamaConfig(vocab_size=tok.get_vocab_size(), **HUB), seed=0)
    root = tmp_path_factory.mktemp("hub")
    plain = write_hub_folder(root / "plain", reference, tok)
    shutil.copytree(plain, root / "llama3")
    config = json.loads((root / "llama3" / "config.json").read_text())
    (root / "llama3" / "config.json").write_text(json.dumps({**config, **LLAMA3}))
    return reference, tok, plain, root / "llama3"


def _on_text(text_glob) -> list[str]:
    """Config overrides: the test corpus as the run's data (the default corpus is fetched on first use)."""
    return ["--config.mesh.shape=(1,1,1)", "--config.data.source=text", f"--config.data.path={text_glob}"]


def _import(run_cli, folder, workdir, text_glob):
    code, lines = run_cli(import_cli.main, str(folder), f"--workdir={workdir}", *_on_text(text_glob))
    assert code == 0, lines


def _export(run_cli, source, out) -> list[str]:
    code, lines = run_cli(export_cli.main, str(source), str(out))
    assert code == 0, lines
    return lines


def _warm_start(variant: str, folder, workdir, text_glob):
    """Checkpoint 0 of a run of `variant` attention started from the Hub folder (freeatten-import's, another attention)."""
    cfg = base.get_config(variant, "tiny", init=str(folder))
    cfg.update_from_flattened_dict({"mesh.shape": (1, 1, 1), "data.source": "text", "data.path": text_glob})
    loop.train_and_evaluate(cfg, workdir, initialise_only=True)
    return workdir


def _assert_same_tensors(folder, hub_folder):
    ours, theirs = load_file(folder / "model.safetensors"), load_file(hub_folder / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype and np.array_equal(ours[name], theirs[name]), name


@pytest.mark.parametrize("rope", ["default", "llama3"])
def test_import_export_import_gives_back_the_tensors_config_and_tokenizer_exactly(rope, hub, run_cli, text_glob, tmp_path):
    folder = hub[2] if rope == "default" else hub[3]
    _import(run_cli, folder, tmp_path / "run", text_glob)
    lines = _export(run_cli, tmp_path / "run", tmp_path / "out")
    written = "model.safetensors, config.json, generation_config.json, tokenizer.json, tokenizer_config.json"
    assert lines == [f"exported {tmp_path / 'run'}@0 (softmax) to {tmp_path / 'out'}: {written}"]
    _assert_same_tensors(tmp_path / "out", folder)
    exported, original = LlamaConfig.from_pretrained(tmp_path / "out"), LlamaConfig.from_pretrained(folder)
    assert {k: getattr(exported, k) for k in FIELDS} == {k: getattr(original, k) for k in FIELDS}
    assert exported.rope_scaling == (LLAMA3["rope_scaling"] if rope == "llama3" else None)
    assert hf_export.ATTENTION_KEY not in json.loads((tmp_path / "out" / "config.json").read_text())
    assert (tmp_path / "out" / "tokenizer.json").read_text() == (folder / "tokenizer.json").read_text()

    _import(run_cli, tmp_path / "out", tmp_path / "again", text_glob)
    first, again = load_run(tmp_path / "run"), load_run(tmp_path / "again")
    assert first.config.model == again.config.model and first.config.train.seq_len == again.config.train.seq_len == 64
    first_params, again_params = flat_params(first.model), flat_params(again.model)
    assert sorted(first_params) == sorted(again_params)
    for name, value in first_params.items():
        assert value.dtype == again_params[name].dtype and np.array_equal(value, again_params[name]), name


def test_a_llama_shaped_run_loads_in_transformers_with_our_logits(run_cli, text_glob, tmp_path):
    """A model trained here (not imported: no Hub layout behind it), untied, GQA: FlaxLlama loads the export and gives
    our logits; the run's byte tokenizer is not a Hugging Face one, which the export says."""
    llama = {"model.mlp": "swiglu", "model.norm": "rmsnorm", "model.tie_embeddings": False, "model.num_layers": 2}
    llama |= {"model.num_heads": 4, "model.num_kv_heads": 2}
    loop.train_and_evaluate(tiny_config("softmax", text_glob, **llama), tmp_path / "run")
    lines = _export(run_cli, f"{tmp_path / 'run'}@6", tmp_path / "out")
    assert lines == [
        f"exported {tmp_path / 'run'}@6 (softmax) to {tmp_path / 'out'}: model.safetensors, config.json, generation_config.json",
        f"{tmp_path / 'run'} has no Hugging Face tokenizer (data.tokenizer=byte): {tmp_path / 'out'} has none",
    ]
    assert GenerationConfig.from_pretrained(tmp_path / "out").eos_token_id is None  # no Hub model behind it
    run = load_run(tmp_path / "run")
    reference = FlaxLlamaForCausalLM.from_pretrained(tmp_path / "out")
    tokens_T = run.encode(TEXT)[:16]  # FlaxLlama's mask spans max_position_embeddings, the training length
    tokens_BT = np.stack([tokens_T, tokens_T[::-1]])
    ours_BTV, theirs_BTV = np.asarray(run.model(tokens_BT)), np.asarray(reference(tokens_BT).logits)
    error = float(np.abs(ours_BTV - theirs_BTV).max())
    print(f"max |logit difference| vs FlaxLlamaForCausalLM.from_pretrained: {error:.2e}")
    assert error <= 1e-4 and np.abs(theirs_BTV).max() > 1e-2


def test_the_export_carries_the_hub_models_special_tokens_and_generation_config(hub, run_cli, text_glob, tmp_path):
    """bos/eos of the Hub folder the run's weights came from (an import; an LSSAR run started from that import, through
    its init.json) in config.json and generation_config.json, as transformers reads them; a Hub folder's own
    generation_config.json is kept whole."""
    _, _, folder, _ = hub
    original = LlamaConfig.from_pretrained(folder)
    _import(run_cli, folder, tmp_path / "run", text_glob)
    lssar = _warm_start("lssar", tmp_path / "run", tmp_path / "lssar", text_glob)
    for run in (tmp_path / "run", lssar):
        _export(run_cli, run, tmp_path / f"out-{run.name}")
        config, generation = (
            AutoConfig.from_pretrained(tmp_path / f"out-{run.name}"),
            GenerationConfig.from_pretrained(tmp_path / f"out-{run.name}"),
        )
        assert (config.bos_token_id, config.eos_token_id) == (original.bos_token_id, original.eos_token_id) == (1, 2)
        assert (generation.bos_token_id, generation.eos_token_id) == (1, 2)

    shutil.copytree(folder, tmp_path / "hub")
    GenerationConfig(bos_token_id=1, eos_token_id=[2, 3], temperature=0.7, do_sample=True).save_pretrained(tmp_path / "hub")
    _import(run_cli, tmp_path / "hub", tmp_path / "own", text_glob)
    _export(run_cli, tmp_path / "own", tmp_path / "out-own")
    generation = GenerationConfig.from_pretrained(tmp_path / "out-own")
    assert (generation.eos_token_id, generation.temperature, generation.do_sample) == ([2, 3], 0.7, True)


def test_an_imported_runs_export_loads_in_transformers_with_its_tokenizer(hub, run_cli, text_glob, tmp_path):
    reference, tok, folder, _ = hub
    _import(run_cli, folder, tmp_path / "run", text_glob)
    _export(run_cli, tmp_path / "run", tmp_path / "out")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp_path / "out")
    run = load_run(tmp_path / "run")
    assert tokenizer(TEXT, add_special_tokens=False)["input_ids"] == run.encode(TEXT).tolist() == tok.encode(TEXT).ids
    tokens_BT = run.encode(TEXT)[None]
    theirs_BTV = np.asarray(FlaxLlamaForCausalLM.from_pretrained(tmp_path / "out")(tokens_BT).logits)
    assert np.abs(np.asarray(run.model(tokens_BT)) - theirs_BTV).max() <= 1e-4


@pytest.mark.parametrize("variant", ["lssar", "ssmax"])
def test_another_attention_keeps_llamas_tensors_and_records_the_variant_with_a_note(variant, hub, run_cli, text_glob, tmp_path):
    _, _, folder, _ = hub
    run = _warm_start(variant, folder, tmp_path / "run", text_glob)
    lines = _export(run_cli, run, tmp_path / "out")
    assert lines[-1] == (
        f"note: transformers cannot run {variant} attention as is (it would run softmax); config.json records it under "
        f"{hf_export.ATTENTION_KEY}"
    )
    _assert_same_tensors(tmp_path / "out", folder)  # SSMax's s and b are no Hub tensors
    record = getattr(LlamaConfig.from_pretrained(tmp_path / "out"), hf_export.ATTENTION_KEY)  # transformers keeps it
    model = load_run(run).config.model
    if variant == "lssar":
        assert record == {"attention": "lssar", "attention_options": {"p": 15.0, "temperature_length": None}}
    else:
        params = flat_params(load_run(run).model)
        s_LH = [params[f"blocks.{i}.attn.s_H"].tolist() for i in range(model.num_layers)]
        assert np.allclose(s_LH, 1 / np.log(64)) and np.shape(s_LH) == (2, 4)  # s log N = 1 at the training length
        assert record == {
            "attention": "ssmax",
            "attention_options": {"scale": None},
            "ssmax_s_init": None,
            "ssmax_bias": False,
            "ssmax_learn_s": True,
            "ssmax_s": s_LH,
        }


def _run(kind, text_glob, tmp_path):
    """The run a refusal case exports: a model of the tiny preset (GPT-2's shape) with `kind`'s changes, or the Hub
    folder itself."""
    changes = {
        "gpt2": {},
        "layernorm": {"model.mlp": "swiglu"},
        "biases": {"model.mlp": "swiglu", "model.norm": "rmsnorm", "model.use_bias": True},
    }
    cfg = tiny_config("softmax", text_glob, **changes[kind], **{"train.steps": 1, "train.eval_every": 1})
    loop.train_and_evaluate(cfg, tmp_path / "run")
    return tmp_path / "run"


REFUSED = {  # case -> (its run, the output folder's files before, what the one line must say)
    "gpt2's shape": ("gpt2", [], "model.mlp='gelu' (Llama's MLP is swiglu): only Llama-shaped models"),
    "layernorm": ("layernorm", [], "model.norm='layernorm' (Llama's norm is rmsnorm)"),
    "biases": ("biases", [], "model.use_bias=True (Llama has no biases)"),
    "an output folder with a model": (
        "hub",
        ["config.json"],
        "{out} already holds config.json: export to a new folder",
    ),
    "a Hub folder as the run": (
        "the hub itself",
        [],
        "{run} is a Hugging Face checkpoint folder, not a run: import it first with freeatten-import {run} --workdir=WORKDIR",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_refused_export_is_one_error_line_and_writes_nothing(case, hub, run_cli, text_glob, tmp_path):
    kind, files, expected = REFUSED[case]
    if kind == "hub":
        run = _warm_start("softmax", hub[2], tmp_path / "run", text_glob)
    elif kind == "the hub itself":
        run = shutil.copytree(hub[2], tmp_path / "hub")
    else:
        run = _run(kind, text_glob, tmp_path)
    (tmp_path / "out").mkdir()
    for name in files:
        (tmp_path / "out" / name).write_text("{}")
    before = {str(p): p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    code, lines = run_cli(export_cli.main, str(run), str(tmp_path / "out"))
    expected = expected.format(out=tmp_path / "out", run=run)
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert {str(p): p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_export_takes_a_run_and_a_folder(run_cli, tmp_path):
    code, lines = run_cli(export_cli.main, str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c"))
    expected = "error: give a run and an output folder (got 3 paths): freeatten-export WORKDIR[@STEP] OUT"
    assert (code, lines) == (1, [expected]) and not list(tmp_path.iterdir())


def test_help_shows_the_usage(run_cli):
    code, lines = run_cli(export_cli.main, "--help")
    usage = "    freeatten-export runs/smollm2-lssar OUT_DIR        # the latest checkpoint; WORKDIR@STEP for another"
    assert code == 0 and usage in lines, lines
