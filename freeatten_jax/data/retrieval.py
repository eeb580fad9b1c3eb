"""Synthetic retrieval sequences mixed into the training stream, meant to teach retrieval at 1x so that
a length-extrapolation test of retrieval can tell variants apart (the `tiny` model does not
learn it in 600 steps: docs/results.md).

A sequence is Landmark filler (FILLER, also evaluation.passkey's, space-joined) with the needle "The pass key is
NNNNN. " at a random depth, then the query "\\nThe pass key is" and the answer " NNNNN": a short form of
the Landmark passkey that fits a 64-token training window. A fraction `f` of the stream's windows is
replaced: window i is synthetic iff floor((i + 1) f) > floor(i f) (so exactly floor(n f) of the first n),
and its content is drawn from a generator seeded by (seed, i): deterministic, and resumed exactly with
the stream's position. Evaluation builds the same sequences at 1x..16x (`build_prompt`).
"""

import numpy as np

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. "
QUERY = "\nThe pass key is"
ANSWER = " {key}"


def largest_that_fits(size, budget: int) -> int:
    """The largest n >= 0 with size(n) <= budget, for a size that grows with n (double, then bisect); 0 if none."""
    low, high = 0, 1
    while size(high) <= budget:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if size(mid) <= budget else (low, mid)
    return low


def _encode(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer.encode(text), np.int32)


def filler_tokens(tokenizer, tokens: int) -> np.ndarray:
    """At least `tokens` tokens of filler (also the noise haystack of data.ruler)."""
    chars = max(tokens, 1)
    while len(ids := _encode(tokenizer, " ".join([FILLER] * (chars // len(FILLER) + 1)))) < tokens:
        chars *= 2
    return ids


def example(tokenizer, length: int, depth: float, key: str) -> tuple[np.ndarray, slice, int]:
    """(sequence of exactly `length` tokens ending with the answer, needle slice, answer token count);
    ValueError if the needle, query and answer alone are longer than `length`."""
    needle, query, answer = (_encode(tokenizer, t.format(key=key)) for t in (NEEDLE, QUERY, ANSWER))
    budget = length - len(needle) - len(query) - len(answer)
    if budget < 0:
        raise ValueError(f"the retrieval sequence without filler is {length - budget} tokens, longer than {length}")
    filler = filler_tokens(tokenizer, budget)
    before = int(round(depth * budget))
    tokens = np.concatenate([filler[:before], needle, filler[before:budget], query, answer])
    return tokens, slice(before, before + len(needle)), len(answer)


def build_prompt(tokenizer, length: int, depth: float, key: str) -> tuple[np.ndarray, slice]:
    """The evaluation prompt at `length`: a window of length + 1 tokens (as training's) without its answer."""
    tokens, needle, answer = example(tokenizer, length + 1, depth, key)
    return tokens[:-answer], needle


class Mix:
    """Replaces a fraction of the training stream's windows [L] by synthetic retrieval sequences (grain map_with_index)."""

    def __init__(self, tokenizer, fraction: float, length: int, seed: int):
        self.tokenizer, self.fraction, self.length, self.seed = tokenizer, fraction, length, seed
        example(tokenizer, length, 0.5, "12345")  # fails now, not in a worker, if the window is too short

    def is_synthetic(self, index: int) -> bool:
        return int((index + 1) * self.fraction) > int(index * self.fraction)

    def __call__(self, index: int, window_L: np.ndarray) -> np.ndarray:
        if not self.is_synthetic(index):
            return window_L
        rng = np.random.default_rng((self.seed, index))
        key = str(rng.integers(10_000, 100_000))
        return example(self.tokenizer, self.length, float(rng.random()), key)[0].astype(window_L.dtype)
