"""The RULER-style suite: prompts of exact token counts with their needles where stated and their answers in the text,
scoring by string match and by likelihood rank, the effective length, and freeatten-eval's --ruler, resumed per cell
and over a 'context' axis."""

import collections
import csv
import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config

from freeatten_jax import attention
from freeatten_jax.cli import evaluate as eval_cli
from freeatten_jax.data import ruler
from freeatten_jax.data.tokenizer import BpeTokenizer, ByteTokenizer
from freeatten_jax.evaluation import results, ruler_report, stats, suite
from freeatten_jax.evaluation import ruler as scoring
from freeatten_jax.evaluation.results import RulerCell, RunResult
from freeatten_jax.training.loss import next_token_losses
from freeatten_jax.training.run_dir import load_run

BYTES = ByteTokenizer()
PROSE = "the old man walked to the river and sat on a stone while the sun went down over the quiet hills. " * 40
TEXT_T = BYTES.encode(PROSE).astype(np.int32)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A byte-level BPE whose merges cross the prompts' words: token counts are not additive in the text."""
    training = PROSE + " ".join(ruler.WORDS) + ruler.NIAH_OPENING + " One of the special magic numbers 1234567. VAR "
    return BpeTokenizer(tmp_path_factory.mktemp("bpe") / "bpe.json", 400, [training * 5])


@pytest.mark.parametrize("task", list(ruler.TASKS))
def test_every_prompt_has_exactly_the_length_and_the_same_facts_at_every_length(task, bpe):
    for tokenizer in (BYTES, bpe):
        text_T = np.asarray(tokenizer.encode(PROSE * 10), np.int32)
        made = [ruler.example(task, tokenizer, n, 0, 3, text_T) for n in (1100, 1537, 2048, 4096)]
        assert [len(e.tokens) for e in made] == [1100, 1537, 2048, 4096]
        assert all(e.answers == made[0].answers and e.wrong == made[0].wrong for e in made)  # only the haystack grows
        assert len(made[0].wrong) == 9 and not set(made[0].wrong) & set(made[0].answers)
        again = ruler.example(task, tokenizer, 1537, 0, 3, text_T)
        np.testing.assert_array_equal(again.tokens, made[1].tokens)
        assert ruler.example(task, tokenizer, 1537, 1, 3, text_T).answers != made[1].answers  # another seed


def _opening(task: str) -> int:
    """Tokens of the task's opening line."""
    return len(BYTES.encode(ruler.TASKS[task](BYTES, *[np.random.default_rng(0)] * 2, TEXT_T, 0).opening))


def _budget(example: ruler.Example, task: str) -> int:
    """The haystack's tokens: the prompt's less the opening, the needles and the question (from the last newline)."""
    question = len(BYTES.decode(example.tokens).rpartition("\n")[2]) + 1
    return len(example.tokens) - _opening(task) - sum(s.stop - s.start for s in example.needles) - question


@pytest.mark.parametrize("task", ["niah_single", "niah_multivalue", "niah_multiquery", "vt"])
def test_needles_sit_at_their_depths_from_rulers_grid(task):
    example = ruler.example(task, BYTES, 3000, 0, 5, TEXT_T)
    opening, budget, before = _opening(task), _budget(example, task), 0
    for needle, depth in zip(example.needles, example.depths):
        assert needle.start - opening - before == round(depth * budget)  # haystack tokens before it
        assert np.isclose(ruler.DEPTHS, depth, atol=1 / budget).any()  # one of RULER's 40 depths
        before += needle.stop - needle.start
    assert example.depths == sorted(example.depths) and len(set(example.depths)) == len(example.depths)


def test_a_distractor_haystack_keeps_its_needles_whole():
    example = ruler.example("niah_multikey", BYTES, 3000, 0, 5)
    (needle,) = example.needles
    text = BYTES.decode(example.tokens)
    lines = re.findall(r"One of the special magic numbers for ([a-z-]+) is: (\d+)\.", text)
    assert len(lines) > 30  # distractors fill the haystack
    asked = re.search(r"number for ([a-z-]+) mentioned", text).group(1)
    assert [v for k, v in lines if k == asked] == example.answers  # one needle for the key asked
    assert BYTES.decode(example.tokens[needle]) == f" One of the special magic numbers for {asked} is: {example.answers[0]}. "
    assert set(example.wrong) < {v for _, v in lines}  # the wrong answers are distractors in the text
    unit = needle.stop - needle.start  # the needle goes between two distractors: within one of its depth
    assert np.abs(ruler.DEPTHS - example.depths[0]).min() <= unit / _budget(example, "niah_multikey")
    assert BYTES.decode(example.tokens[needle.start - unit : needle.start]).startswith(" One of the special")


@pytest.mark.parametrize("index", range(3))
def test_the_answers_are_recoverable_from_the_text(index):
    def text(task):
        example = ruler.example(task, BYTES, 2500, 7, index, TEXT_T)
        return BYTES.decode(example.tokens), example.answers

    for task in ("niah_single", "niah_multivalue", "niah_multiquery"):
        prompt, answers = text(task)
        asked = re.search(r"numbers? for (.+?) mentioned", prompt).group(1).replace(" and ", ", ").split(", ")
        values = re.findall(r"magic numbers for ([a-z-]+) is: (\d+)\.", prompt)
        assert [v for key in asked for k, v in values if k == key] == answers, task
    prompt, names = text("vt")
    value = re.search(r"assigned the value (\d+) in", prompt).group(1)
    assigned = dict(re.findall(r"VAR ([A-Z]+) = (?:VAR )?([A-Z0-9]+)\.", prompt))
    resolve = lambda name: resolve(assigned[name]) if assigned[name] in assigned else assigned[name]  # noqa: E731
    assert sorted(n for n in assigned if resolve(n) == value) == sorted(names) and len(names) == ruler.HOPS + 1
    for task, top in (("cwe", ruler.CWE_COMMON), ("fwe", ruler.FWE_TOP)):
        prompt, answers = text(task)
        words = [w for w in prompt.split("\n")[1].split() if w in ruler.WORDS]
        counts = collections.Counter(words)
        assert len(answers) == top and min(counts[a] for a in answers) > max(c for w, c in counts.items() if w not in answers)


def test_a_length_too_short_for_the_task_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"the vt prompt without haystack is 411 tokens, longer than the length 400"):
        ruler.example("vt", BYTES, 400, 0, 0)
    with pytest.raises(ValueError, match=r"a list of \d+ words is too short to rank its 5 most frequent words"):
        ruler.example("cwe", BYTES, 330, 0, 0)
    with pytest.raises(ValueError, match="the haystack needs .* tokens of held-out text; there are 100"):
        ruler.example("niah_multivalue", BYTES, 2000, 0, 0, TEXT_T[:100])


def test_string_match_is_the_fraction_of_references_found_case_insensitively():
    assert scoring.string_match(" 1234567, 7654321 and more", ["1234567", "7654321", "1111111"]) == pytest.approx(2 / 3)
    assert scoring.string_match(" they are: abcde, Fghij", ["ABCDE", "FGHIJ"]) == 1.0
    assert scoring.string_match(" 123456", ["1234567"]) == 0.0


def test_each_reference_is_ranked_among_the_wrong_answers_only():
    totals_C = np.asarray([-1.0, -5.0, -3.0, -2.0, -4.0])  # references -1, -5; wrong -3, -2, -4
    assert scoring.ranks(totals_C, 2) == [1, 4]
    assert scoring.ranks(np.asarray([-2.0, -2.0]), 1) == [2]  # a tie counts against it


@pytest.fixture(scope="module")
def run(text_glob, trained_run):
    """The tiny lssa run of test_eval_resume (training length 16, bytes)."""
    return str(trained_run("eval-resume-lssa", tiny_config("lssa", text_glob)))


def test_an_examples_scores_are_its_greedy_match_and_its_references_likelihood_ranks(run):
    loaded = load_run(run)
    example = ruler.example("niah_multivalue", loaded.tokenizer, 700, 0, 0, TEXT_T, 3)
    mesh = suite._context_mesh(1)
    match, rank, top1 = scoring.score(loaded.model, loaded.tokenizer, example, mesh)
    steps = len(" " + ", ".join(example.answers)) + 2
    graphdef, state = nnx.split(loaded.model)
    logits = jax.jit(lambda state, tokens_BT: nnx.merge(graphdef, state)(tokens_BT))
    tokens_T = np.pad(example.tokens, (0, steps))  # causal: the padding after a position does not change it
    for t in range(len(example.tokens), len(tokens_T)):  # greedy by hand, whole forward passes
        tokens_T[t] = int(np.argmax(np.asarray(logits(state, jnp.asarray(tokens_T[None])))[0, t - 1]))
    totals = []
    for c in [*example.answers, *example.wrong]:
        full = np.concatenate([example.tokens, BYTES.encode(" " + c)]).astype(np.int32)[None]
        totals.append(-float(np.asarray(next_token_losses(loaded.model, jnp.asarray(full)))[0, len(example.tokens) - 1 :].sum()))
    assert match == scoring.string_match(BYTES.decode(tokens_T[len(example.tokens) :]), example.answers)
    own = [1 + sum(w >= totals[a] for w in totals[4:]) for a in range(4)]
    assert rank == np.mean(own) and top1 == np.mean(np.asarray(own) == 1)
    written = BYTES.encode(f" {example.answers[2].upper()}, 0000000").astype(np.int32)  # one of the four references
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scoring, "generate", lambda model, prompt_BT, steps, **_: np.concatenate([prompt_BT[0], written])[None])
        assert scoring.score(loaded.model, loaded.tokenizer, example, mesh)[0] == 0.25


def test_effective_length_is_the_longest_multiplier_up_to_which_the_score_keeps_the_fraction():
    scores = {1: 0.8, 2: 0.75, 4: 0.6, 8: 0.7, 16: 0.1}
    assert ruler_report.effective_length(scores, 0.85) == 2  # 4x falls below 0.68; 8x's recovery does not count
    assert ruler_report.effective_length(scores, 0.7) == 8
    assert ruler_report.effective_length({1: 0.5, 2: None, 4: 0.5}, 0.85) == 1  # a length not scored ends it
    assert ruler_report.effective_length({1: 0.0, 2: 0.0}, 0.85) is None  # nothing to keep
    assert ruler_report.effective_length({2: 0.4, 4: 0.4}, 1.0) == 4  # from the shortest multiplier measured


def _run(name: str, seed: int, match_by_m: dict) -> RunResult:
    cells = [
        RulerCell("vt", 16 * m, m, match=list(v), rank=[1.0] * len(v), top1=[1.0] * len(v), depth=[None] * len(v))
        for m, v in match_by_m.items()
    ]
    return RunResult(name, name, 6, "lssa", "none", seed, 16, 1e4, ruler=cells)


def test_the_table_holds_seed_level_intervals_and_the_effective_length():
    runs = [_run("a", 0, {1: [1.0, 0.0], 2: [1.0, 1.0]}), _run("b", 1, {1: [1.0, 1.0], 2: [0.0, 0.0]})]
    settings = {"multipliers": [1, 2], "ruler_keep": 0.5, "ruler_examples": 2, "ruler_candidates": 3}
    (section,) = ruler_report.markdown(runs, settings)
    one = stats.seed_level([(1.0, np.asarray([[1.0, 0.0], [1.0, 1.0]]))])
    assert one["difference"] == 0.75 and one["ci"][0] < 0.75 < one["ci"][1]
    row = f"| lssa (2 runs) | vt | 0.750 [{one['ci'][0]:.3f}, {one['ci'][1]:.3f}] | 0.500 [{-5.853:.3f}, {6.853:.3f}] | 2x |"
    assert row in section.split("### string match")[1].split("###")[0], section
    assert ruler_report.markdown([dataclasses.replace(runs[0], ruler=[])], settings) == []


FLAGS = ["--multipliers=32,64", "--eval_tokens=1025", "--passkey_depths=0.5", "--passkey_keys=1", "--passkey_candidates=3"]
RULER = ["--ruler=niah_single,niah_multivalue,cwe", "--ruler_examples=2", "--ruler_candidates=3"]


@pytest.mark.slow
def test_freeatten_eval_writes_the_ruler_table_and_resumes_skipping_finished_cells(run, tmp_path, run_cli):
    code, lines = run_cli(eval_cli.main, f"--workdir={run}", f"--out={tmp_path}", *FLAGS, *RULER)
    assert code == 0, lines[-5:]
    (result,), settings = results.read(tmp_path / "results.json")
    assert [(c.task, c.length) for c in result.ruler] == [
        (t, n) for t in ("niah_single", "niah_multivalue", "cwe") for n in (512, 1024)
    ]
    scored = {(c.task, c.length): c for c in result.ruler}
    assert {key: c.reason for key, c in scored.items() if c.reason} == {
        ("niah_multivalue", 512): "the niah_multivalue prompt without haystack is 571 tokens, longer than the length 512"
    }
    for cell in (c for c in result.ruler if not c.reason):
        assert len(cell.match) == 2 and all(0 <= x <= 1 for x in cell.match + cell.top1) and all(1 <= x <= 3 for x in cell.rank)
    assert all(d is not None for d in scored["niah_single", 512].depth) and scored["cwe", 1024].depth == [None, None]
    report = (tmp_path / "report.md").read_text()
    single = [np.mean(scored["niah_single", n].match) for n in (512, 1024)]
    assert f"| lssa | niah_single | {single[0]:.3f} | {single[1]:.3f} |" in report
    assert "- niah_multivalue at length 512: the niah_multivalue prompt without haystack is 571 tokens" in report
    assert (tmp_path / "ruler.png").exists() and "![RULER depth x length](ruler.png)" in report
    rows = list(csv.reader((tmp_path / "ruler.csv").open()))  # one per example, one per cell not scored
    assert len(rows) == 1 + sum(len(c.match) or 1 for c in result.ruler)
    assert [float(x) for x in rows[1][5:8]] == [
        scored["niah_single", 512].match[0],
        scored["niah_single", 512].rank[0],
        scored["niah_single", 512].top1[0],
    ]

    (job,) = (tmp_path / "cells").glob("*/")
    saved = json.loads((job / "ruler-niah_single-1024.json").read_text())
    saved["match"] = [0.25, 0.75]  # values no string match of one reference gives: read back, so the cell was skipped
    (job / "ruler-niah_single-1024.json").write_text(json.dumps(saved))
    (job / "ruler-cwe-1024.json").unlink()
    (job / "run.json").unlink()
    code, lines = run_cli(eval_cli.main, f"--workdir={run}", f"--out={tmp_path}", *FLAGS, *RULER)
    cells = 2 + 1 + 2 * 2 + 3 * 2
    assert code == 0 and any(f"resuming: {cells - 1} of {cells} cells done already" in line for line in lines), lines
    (again,), _ = results.read(tmp_path / "results.json")
    redone = {(c.task, c.length): c for c in again.ruler}
    assert redone["niah_single", 1024].match == [0.25, 0.75] and redone["cwe", 1024] == scored["cwe", 1024]


@pytest.mark.slow
def test_ruler_over_a_context_axis_scores_as_on_one_device(run, tmp_path, monkeypatch):
    """At 1024 tokens (64x) over context=2: the KV cache decoded on both devices' slots, the candidates' log-likelihoods
    round the ring (padded to a multiple of 2 x 2), the same scores as on one device."""
    decoded, ring = [], []
    real_decode, real_ring = attention.sharded_decode_attend, attention.context_parallel_attend
    monkeypatch.setattr(attention, "sharded_decode_attend", lambda *a, **k: decoded.append(1) or real_decode(*a, **k))
    monkeypatch.setattr(
        attention, "context_parallel_attend", lambda *a, **k: ring.append((a[0].shape[1], "kv_mask" in k)) or real_ring(*a, **k)
    )
    settings = suite.Settings(
        multipliers=(64,), eval_tokens=1025, passkey_depths=(), ruler=("niah_single", "vt"), ruler_examples=2, ruler_candidates=4
    )
    (single,) = suite.run_suite([run], [], settings, str(tmp_path / "1"))
    assert not decoded and not ring
    (sharded,) = suite.run_suite([run], [], dataclasses.replace(settings, context=2), str(tmp_path / "2"))
    scored = {q for q, cache in ring if not cache and q > 1024}  # the candidates after the prompt
    assert decoded and scored and all(q % 4 == 0 for q in scored), ring
    assert [c.task for c in sharded.ruler] == ["niah_single", "vt"] and all(len(c.match) == 2 for c in sharded.ruler)
    for a, b in zip(single.ruler, sharded.ruler):
        assert (a.match, a.rank, a.top1, a.depth) == (b.match, b.rank, b.top1, b.depth)
