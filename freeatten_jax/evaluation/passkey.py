"""Passkey retrieval prompts exactly in the Landmark-attention format (docs/method.md §7), and their scoring.

The prompt is the lines [opening, filler before, needle, filler after, question] joined by newlines,
where the filler is FILLER repeated and space-joined, cut by characters as Landmark cuts it.
"""

import re

import numpy as np

from freeatten_jax.data.retrieval import FILLER, largest_that_fits  # FILLER: Landmark's sentences, also the training mix's

OPENING = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"


def random_keys(rng: np.random.Generator, count: int) -> list[str]:
    """Five-digit keys."""
    return [str(k) for k in rng.integers(10_000, 100_000, size=count)]


def filler(chars: int) -> str:
    """The first `chars` characters of the filler repeated and space-joined."""
    return " ".join([FILLER] * (chars // (len(FILLER) + 1) + 1))[:chars]


def prompt_text(filler_chars: int, depth: float, key: str) -> str:
    """The Landmark prompt with `filler_chars` filler characters, a fraction `depth` of them before the needle."""
    before = int(round(depth * filler_chars))
    return "\n".join([OPENING, filler(before), NEEDLE.format(key=key), filler(filler_chars - before), QUESTION])


def _pieces(filler_chars: int, depth: float, key: str) -> list[str]:
    """The prompt cut after the line before the needle and after the needle's line (to locate its tokens)."""
    text = prompt_text(filler_chars, depth, key)
    needle = NEEDLE.format(key=key) + "\n"
    start = text.index("\n" + needle) + 1
    return [text[:start], needle, text[start + len(needle) :]]


def build_prompt(tokenizer, length: int, depth: float, key: str) -> tuple[np.ndarray, slice]:
    """The longest Landmark prompt of at most `length` tokens (as much filler as fits) with the needle at
    `depth` (0 = start, 1 = end), and the slice of the needle's tokens. Each of the three pieces (up to the
    needle, the needle line, the rest) is encoded on its own so the needle's tokens are known; ValueError
    if even the prompt without filler is longer than `length`."""

    def encode(chars):
        return [np.asarray(tokenizer.encode(p), np.int32) for p in _pieces(chars, depth, key)]

    size = lambda chars: sum(len(p) for p in encode(chars))
    if (shortest := size(0)) > length:
        raise ValueError(f"the passkey prompt without filler is {shortest} tokens, longer than the length {length}")
    low = largest_that_fits(size, length)  # tokens grow with the filler
    head, needle, tail = encode(low)
    return np.concatenate([head, needle, tail]), slice(len(head), len(head) + len(needle))


def first_integer(text: str) -> str | None:
    """The first run of digits in `text`, or None."""
    match = re.search(r"\d+", text)
    return match.group(0) if match else None


def is_retrieved(generated_text: str, key: str) -> bool:
    """Whether the first integer generated equals the key ("123456" does not count for 12345)."""
    return first_integer(generated_text) == key


def key_rank(key_loglik: float, other_logliks) -> int:
    """Rank (1 = best) of the true key's likelihood among the candidates; ties count against it."""
    return 1 + int(np.sum(np.asarray(other_logliks) >= key_loglik))
