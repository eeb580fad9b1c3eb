"""Passkey retrieval prompts in the Landmark-attention format, and exact-match scoring of a continuation."""
import numpy as np

INTRO = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information there.\n"
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "What is the pass key? The pass key is"


def random_keys(rng: np.random.Generator, count: int) -> list[str]:
    return [str(k) for k in rng.integers(10_000, 100_000, size=count)]


def build_prompt(tokenizer, length: int, depth: float, key: str) -> tuple[np.ndarray, slice]:
    """Prompt tokens of exactly `length` tokens with the needle at `depth` (0 = start, 1 = end),
    and the slice of the needle's tokens; raises ValueError if length cannot hold the needle."""
    encode = lambda text: np.asarray(tokenizer.encode(text), np.int32)
    intro, needle, question = encode(INTRO), encode(NEEDLE.format(key=key)), encode(" " + QUESTION.lstrip())
    filler_budget = length - len(intro) - len(needle) - len(question)
    if filler_budget < 0:
        raise ValueError(f"passkey length {length} is too short for the needle and question ({length - filler_budget} tokens)")
    filler = encode(FILLER * (filler_budget // max(len(encode(FILLER)), 1) + 1))[:filler_budget]
    before = int(round(depth * filler_budget))
    tokens = np.concatenate([intro, filler[:before], needle, filler[before:], question])
    start = len(intro) + before
    return tokens, slice(start, start + len(needle))


def exact_match(tokenizer, generated: np.ndarray, key: str) -> bool:
    """Whether the greedy continuation starts with the key (leading spaces ignored)."""
    return tokenizer.decode(generated).strip().startswith(key)
