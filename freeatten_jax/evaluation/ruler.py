"""Scores the RULER-style tasks (data.ruler) at one length: each example's greedy output (KV cache, nn.decoding) by
RULER's string match, and each reference's log-likelihood rank among wrong answers of its kind (small models rarely
write the exact string). Over a mesh's 'context' axis the cache and the log-likelihoods are split over it.

Glossary: T prompt tokens, A answers (references), C candidates (the references, then the wrong answers).
"""

import dataclasses

import numpy as np

from freeatten_jax import data
from freeatten_jax.data import ruler
from freeatten_jax.evaluation import likelihood, loss, passkey
from freeatten_jax.evaluation.results import RulerCell
from freeatten_jax.nn import sharding
from freeatten_jax.nn.decoding import generate


def held_out(splits: data.Splits, tokens: int, eos_id: int | None) -> np.ndarray:
    """The first `tokens` held-out tokens in one array, document separators dropped: the text haystack."""
    text_T = np.concatenate([np.zeros(0, np.int32), *loss.span(splits.val, tokens)])
    return text_T if eos_id is None else text_T[text_T != eos_id]


def string_match(generated: str, answers: list[str]) -> float:
    """RULER's string_match_all: the fraction of the answers found in the generated text, case-insensitively."""
    return sum(a.lower() in generated.lower() for a in answers) / len(answers)


def ranks(totals_C: np.ndarray, answers: int) -> list[int]:
    """Each reference's rank (1 = best) by log-likelihood among itself and the wrong answers (totals_C[answers:]); the
    other references are not its rivals."""
    return [passkey.key_rank(totals_C[a], totals_C[answers:]) for a in range(answers)]


def score(model, tokenizer, example: ruler.Example, mesh) -> tuple[float, float, float]:
    """(string match of the greedy output, mean rank of the references, fraction of references ranked first)."""
    encode = lambda text: np.asarray(tokenizer.encode(text), np.int32)
    budget = len(encode(" " + ", ".join(example.answers))) + 2  # room for every answer and a little more
    with sharding.use_mesh(mesh, sharding.DEFAULT_RULES):
        out = generate(model, example.tokens[None], budget, temperature=0.0)
    match = string_match(tokenizer.decode(np.asarray(out[0, len(example.tokens) :])), example.answers)
    candidates = [encode(" " + c) for c in [*example.answers, *example.wrong]]
    rank_A = np.asarray(ranks(likelihood.continuations(model, example.tokens, candidates, mesh), len(example.answers)))
    return match, float(rank_A.mean()), float(np.mean(rank_A == 1))


def cell(model, tokenizer, task: str, length: int, multiplier: int, settings, text_T, mesh) -> dict:
    """The RulerCell (as a dict) of `task` at `length`: settings.ruler_examples examples, each with
    settings.ruler_candidates - 1 wrong answers; the reason instead where an example cannot be built."""
    out = RulerCell(task, length, multiplier)
    if tokenizer is None:
        out.reason = "the run has no tokenizer (set data.tokenizer_path for .bin shards)"
        return dataclasses.asdict(out)
    for index in range(settings.ruler_examples):
        try:
            example = ruler.example(task, tokenizer, length, settings.seed, index, text_T, settings.ruler_candidates - 1)
        except ValueError as e:
            return dataclasses.asdict(RulerCell(task, length, multiplier, reason=str(e)))
        match, rank, top1 = score(model, tokenizer, example, mesh)
        out.match.append(match), out.rank.append(rank), out.top1.append(top1)
        out.depth.append(example.depths[0] if len(example.depths) == 1 else None)
    return dataclasses.asdict(out)
