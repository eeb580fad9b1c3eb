"""The `freeatten` lm-evaluation-harness model on a tiny run, offline: its log-likelihoods are the training loss on the
same tokens, is_greedy and generate_until are greedy decoding, nothing depends on batch size or padding, and
freeatten-harness runs local tasks (tests/harness_tasks: one per request type) end to end."""

import dataclasses
import json
import os
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config

from freeatten_jax.evaluation import loss

ROOT = pathlib.Path(__file__).resolve().parents[2]
TASKS = ROOT / "tests" / "harness_tasks"
CONTEXT = 2 * 16  # multiplier 2 x the tiny run's training length


@pytest.fixture(scope="module", autouse=True)
def offline(tmp_path_factory):
    """No network, a private datasets cache, and the working directory the task YAMLs' data_files are relative to."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
            patch.setenv(name, "1")
        patch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf")))
        patch.chdir(ROOT)
        yield


@pytest.fixture(scope="module")
def workdir(text_glob, trained_run):
    """A tiny lssa run (training length 16; the p=15 switch applies to it)."""
    return str(trained_run("eval-resume-lssa", tiny_config("lssa", text_glob)))


@pytest.fixture(scope="module")
def lm(workdir):
    from freeatten_jax.evaluation.harness import FreeattenLM

    return FreeattenLM(workdir, multiplier=2)


@pytest.fixture(scope="module")
def sharp(lm):
    """The model with noise added to its weights: its greedy tokens depend on every token and position (the tiny
    trained model's answer 'eeee' to every prompt), in the same compiled shapes."""
    from freeatten_jax.evaluation.harness import FreeattenLM

    graphdef, params, rest = nnx.split(lm.run.model, nnx.Param, ...)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: x + rng.normal(size=x.shape).astype(x.dtype), params)
    return FreeattenLM(dataclasses.replace(lm.run, model=nnx.merge(graphdef, params, rest)), multiplier=2)


def _request(kind, *args):
    from lm_eval.api.instance import Instance

    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def _log_probs(model, tokens_L) -> np.ndarray:
    """log p of each token after the first, by the training loss on exactly these tokens (no padding, batch 1)."""
    return -loss.token_losses(model, np.asarray([tokens_L], np.int32))[0]  # training.loss.next_token_losses, jitted


PAIRS = [("the cat sat on the", " mat"), ("a dog", " ran to the park"), ("x" * 40, " long context")]  # the last one cut to 32


def test_log_likelihoods_are_the_training_loss_on_the_same_tokens(lm):
    got = lm.loglikelihood([_request("loglikelihood", *pair) for pair in PAIRS])
    for (context, continuation), (logprob, _) in zip(PAIRS, got):
        whole, n = lm.tok_encode(context + continuation), len(lm.tok_encode(continuation))
        np.testing.assert_allclose(logprob, _log_probs(lm.run.model, whole[-(CONTEXT + 1) :])[-n:].sum(), rtol=1e-5)


def test_results_do_not_depend_on_batch_size_or_padding(lm):
    from freeatten_jax.evaluation.harness import FreeattenLM

    one_by_one = FreeattenLM(lm.run, multiplier=2, batch_tokens=1)  # batches of one row, no filler rows
    requests = [_request("loglikelihood", *pair) for pair in PAIRS * 3]
    np.testing.assert_allclose(lm.loglikelihood(requests), one_by_one.loglikelihood(requests), rtol=1e-5)


def test_requests_of_40_lengths_compile_two_shapes(lm):
    """Rows padded to 16 or 32 positions (the context) in full batches: one compile each, whatever the lengths."""
    from freeatten_jax.evaluation import harness

    harness._scores.clear_cache()
    lm._loglikelihood_tokens([(("", ""), [1] * n, [2]) for n in range(1, 41)])
    assert harness._scores._cache_size() == 2


def test_is_greedy_is_greedy_decoding(lm):
    from freeatten_jax.nn.decoding import generate

    prompt = lm.tok_encode("the cat sat")
    greedy = np.asarray(generate(lm.run.model, np.asarray([prompt]), 5, temperature=0))[0, len(prompt) :].tolist()
    other = greedy[:-1] + [(greedy[-1] + 1) % 256]
    got = lm._loglikelihood_tokens([(("", ""), prompt, greedy), (("", ""), prompt, other)])
    assert [g for _, g in got] == [True, False]


def test_rolling_log_likelihood_scores_each_token_once_in_context_windows(lm):
    """Texts of 2 contexts and of less than one: windows [prefix + 32 tokens] and [the 33 tokens after], as
    evaluation.loss cuts held-out text (each window conditioned on the token before it)."""
    texts = ["the quick brown fox jumps over the lazy dog and then sleeps all ", "a short one"]
    got = lm.loglikelihood_rolling([_request("loglikelihood_rolling", t) for t in texts])
    full = [lm.eot_token_id, *lm.tok_encode(texts[0])]
    assert len(full) == 2 * CONTEXT + 1
    expected = sum(_log_probs(lm.run.model, full[i : i + CONTEXT + 1]).sum() for i in (0, CONTEXT))
    np.testing.assert_allclose(got[0], expected, rtol=1e-5)
    np.testing.assert_allclose(got[1], _log_probs(lm.run.model, [lm.eot_token_id, *lm.tok_encode(texts[1])]).sum(), rtol=1e-5)


def test_generate_until_is_greedy_decoding_cut_before_the_stop_string(sharp):
    """Prompts of 7 and 14 tokens share one batch, left-padded to 16: each continues as it does alone, unpadded."""
    from freeatten_jax.nn.decoding import generate

    contexts = ["one two", "the cat sat on"]
    prompts = [sharp.tok_encode(c) for c in contexts]
    alone = [np.asarray(generate(sharp.run.model, np.asarray([p]), 8, temperature=0))[0, len(p) :] for p in prompts]
    np.testing.assert_array_equal(sharp._greedy(prompts, 16, 8), np.stack(alone))
    texts = [sharp.tok_decode(tokens) for tokens in alone]
    stops = [text[3] for text in texts]  # a character each generates: the output ends before its first occurrence
    got = sharp.generate_until(
        [_request("generate_until", c, {"until": [stop], "max_gen_toks": 8}) for c, stop in zip(contexts, stops)]
    )
    assert got == [text[: text.index(stop)] for text, stop in zip(texts, stops)]
    with pytest.raises(ValueError, match="greedily only"):
        sharp.generate_until([_request("generate_until", "one two", {"do_sample": True, "temperature": 1.0})])


def test_model_args_build_the_model_and_bad_ones_are_one_error_line(workdir):
    from lm_eval.api.registry import get_model

    from freeatten_jax.evaluation.harness import FreeattenLM

    assert get_model("freeatten") is FreeattenLM
    lm = FreeattenLM.create_from_arg_string(f"workdir={workdir},multiplier=4,switch=p=15;rope_theta=2x")
    assert lm.max_length == 64 and lm.switch.settings == (("p", "15"), ("rope_theta", "2x"))
    assert lm.run.model.attention_layers[0].rope_theta == 2 * lm.run.config.model.rope_theta
    for args, message in [
        ("multiplier=0", "multiplier must be an integer >= 1"),
        ("implementation=fast", "implementation 'fast' is unknown; allowed: "),
    ]:
        with pytest.raises(ValueError, match=message):
            FreeattenLM.create_from_arg_string(f"workdir={workdir},{args}")


def test_freeatten_harness_runs_local_tasks_of_each_request_type(lm, workdir, tmp_path, run_cli):
    """The command end to end (simple_evaluate, the harness's metrics) against the model's own answers."""
    from freeatten_jax.cli import harness as harness_cli

    tasks = ["tiny_choice", "tiny_word", "tiny_text", "tiny_answer"]
    args = [f"--workdir={workdir}", "--multipliers=2", f"--tasks={','.join(tasks)}", f"--out={tmp_path}"]
    code, lines = run_cli(harness_cli.main, *args, f"--include_path={TASKS}", "--nodefault_tasks", "--switch=s=0.3")
    assert code == 0, lines
    (row,) = json.loads((tmp_path / "harness.json").read_text())["runs"]  # s=0.3 applies to ssmax runs only: skipped
    assert (row["switch"], row["context"]) == ("none", CONTEXT)
    found = row["tasks"]
    docs = {t: [json.loads(line) for line in (TASKS / f"{t[5:]}.jsonl").read_text().splitlines()] for t in tasks}

    correct = []
    for doc in docs["tiny_choice"]:
        scores = [lp for lp, _ in lm.loglikelihood([_request("loglikelihood", doc["context"], c) for c in doc["choices"]])]
        correct.append(int(np.argmax(scores)) == doc["label"])
    assert found["tiny_choice"]["acc"]["value"] == pytest.approx(np.mean(correct))
    low, high = found["tiny_choice"]["acc"]["ci"]  # the project's interval over documents
    assert low <= np.mean(correct) <= high

    words = lm.loglikelihood([_request("loglikelihood", d["context"], " " + d["target"]) for d in docs["tiny_word"]])
    greedy = [g for _, g in words]
    assert found["tiny_word"]["acc"]["value"] == pytest.approx(np.mean(greedy))

    texts = [d["text"] for d in docs["tiny_text"]]
    logprob = sum(lm.loglikelihood_rolling([_request("loglikelihood_rolling", t) for t in texts]))
    words = sum(len(t.split()) for t in texts)
    assert found["tiny_text"]["word_perplexity"] == {"value": pytest.approx(np.exp(-logprob / words)), "ci": None}

    until = {"until": ["\n", "."], "max_gen_toks": 6}  # tiny_answer.yaml's generation_kwargs
    answers = lm.generate_until([_request("generate_until", d["context"], until) for d in docs["tiny_answer"]])
    exact = [a.strip() == d["answer"] for a, d in zip(answers, docs["tiny_answer"])]
    assert found["tiny_answer"]["exact_match"]["value"] == pytest.approx(np.mean(exact))
    assert "tiny_choice acc" in (tmp_path / "harness.md").read_text()
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"


def test_freeatten_harness_help_and_a_bad_multiplier(run_cli, workdir, tmp_path):
    from freeatten_jax.cli import harness as harness_cli

    code, lines = run_cli(harness_cli.main, "--help")
    assert code == 0 and "  --tasks=None (comma separated list of strings, required)" in lines
    code, lines = run_cli(harness_cli.main, f"--workdir={workdir}", "--tasks=x", "--multipliers=0", f"--out={tmp_path}")
    assert (code, lines[-1]) == (1, "error: --multipliers=0 is invalid; allowed: integers >= 1")


def test_an_imported_hub_llama_gives_the_transformers_models_log_likelihoods(text_glob, run_cli, tmp_path):
    import jax
    from helpers import HUB, hub_tokenizer, write_hub_folder
    from transformers import FlaxLlamaForCausalLM, LlamaConfig

    from freeatten_jax.cli import import_hf as import_cli
    from freeatten_jax.evaluation.harness import FreeattenLM

    tok = hub_tokenizer(text_glob)
    reference = FlaxLlamaForCausalLM(LlamaConfig(vocab_size=tok.get_vocab_size(), **HUB), seed=0)
    on_text = ["--config.mesh.shape=(1,1,1)", "--config.data.source=text", f"--config.data.path={text_glob}"]
    code, lines = run_cli(
        import_cli.main, str(write_hub_folder(tmp_path / "hub", reference, tok)), f"--workdir={tmp_path}/run", *on_text
    )
    assert code == 0, lines
    lm = FreeattenLM(f"{tmp_path}/run")
    pairs = [("the king and", " the queen"), ("a lord", " of the land and the sea")]
    got = lm.loglikelihood([_request("loglikelihood", *pair) for pair in pairs])
    for (context, continuation), (logprob, _) in zip(pairs, got):
        context_T, continuation_T = lm._encode_pair(context, continuation)
        tokens_T = np.asarray(context_T + continuation_T)
        log_probs_TV = np.asarray(jax.nn.log_softmax(reference(tokens_T[None, :-1]).logits[0], axis=-1))
        targets = np.arange(len(context_T) - 1, len(tokens_T) - 1)
        np.testing.assert_allclose(logprob, log_probs_TV[targets, tokens_T[targets + 1]].sum(), rtol=1e-4)


def test_a_misspelt_task_and_a_stock_task_offline_are_one_error_line_each(run_cli, workdir, tmp_path):
    """A task name lm-eval does not know: one line with the nearest name; a stock task whose dataset the Hub must
    give, offline (this module's fixture): one line saying so, not lm-eval's traceback."""
    from freeatten_jax.cli import harness as harness_cli

    local = [f"--workdir={workdir}", f"--out={tmp_path}", f"--include_path={TASKS}", "--nodefault_tasks"]
    code, lines = run_cli(harness_cli.main, *local, "--tasks=tiny_choise")
    assert (code, lines[-1]) == (
        1,
        "error: --tasks: no task 'tiny_choise' (--nodefault_tasks: only --include_path's); did you mean 'tiny_choice'?",
    )
    code, lines = run_cli(harness_cli.main, f"--workdir={workdir}", f"--out={tmp_path}", "--tasks=lambada_openai", "--limit=1")
    assert code == 1 and lines[-1].startswith("error: --tasks=lambada_openai: a dataset could not be loaded ("), lines[-3:]
    assert lines[-1].endswith(
        "run once with network (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE unset), or use --include_path's local tasks"
    )
    assert not (tmp_path / "harness.json").exists()
