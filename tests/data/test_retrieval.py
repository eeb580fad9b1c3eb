"""The retrieval mix: synthetic passkey windows in the training stream (documented fraction, seeded,
resumable) and the same sequences at evaluation lengths."""

import numpy as np
import pytest

from freeatten_jax import data
from freeatten_jax.configs import base
from freeatten_jax.data import retrieval
from freeatten_jax.data.tokenizer import ByteTokenizer
from freeatten_jax.training import config

BYTES = ByteTokenizer()


def _synthetic(batches):
    """Per window: True where it is not a run of consecutive integers (the arange shard's real windows)."""
    windows = np.concatenate(batches)
    return (np.diff(windows, axis=1) != 1).any(1)


def _stream(tmp_path, fraction, seed=0):
    if not (tmp_path / "s.bin").exists():  # never rewrite a file an earlier iterator has memory-mapped
        data.write_shard(tmp_path / "s.bin", np.arange(30_000) % 60_000)
    mix = retrieval.Mix(BYTES, fraction, 65, seed)
    return data.train_iterator([data.Shard(tmp_path / "s.bin")], 64, 8, seed=seed, mix=mix)


@pytest.mark.parametrize("fraction", [0.25, 0.1])
def test_mix_replaces_exactly_the_documented_fraction(tmp_path, fraction):
    it = _stream(tmp_path, fraction)
    synthetic = _synthetic([next(it) for _ in range(25)])  # 200 windows
    assert synthetic.sum() == int(200 * fraction)
    assert [int((i + 1) * fraction) > int(i * fraction) for i in range(200)] == synthetic.tolist()


def test_mix_is_seeded_and_resumes_exactly(tmp_path):
    it = _stream(tmp_path, 0.25)
    first = [next(it) for _ in range(3)]
    state = it.get_state()
    rest = [next(it) for _ in range(4)]
    resumed = _stream(tmp_path, 0.25)
    resumed.set_state(state)
    for a, b in zip(rest, [next(resumed) for _ in range(4)]):
        np.testing.assert_array_equal(a, b)
    again = _stream(tmp_path, 0.25)
    np.testing.assert_array_equal(first[0], next(again))
    text = BYTES.decode(first[0][_synthetic(first[:1])][0])
    key = text.rsplit(" ", 1)[1]
    assert text.endswith(f"\nThe pass key is {key}") and f"The pass key is {key}. " in text


def test_examples_hold_needle_query_and_answer_at_every_length():
    tokens, needle, answer = retrieval.example(BYTES, 65, 0.0, "40712")
    assert len(tokens) == 65 and answer == 6
    assert BYTES.decode(tokens[needle]) == "The pass key is 40712. " and needle.start == 0
    assert BYTES.decode(tokens) == "The pass key is 40712. The grass is green. \nThe pass key is 40712"  # filler fills the rest
    prompt, needle = retrieval.build_prompt(BYTES, 1024, 0.5, "40712")
    assert len(prompt) == 1025 - 6 and BYTES.decode(prompt).endswith("\nThe pass key is")
    assert abs(needle.start - (1025 - 45) / 2) <= 1
    with pytest.raises(ValueError, match="without filler is 45 tokens"):
        retrieval.example(BYTES, 40, 0.5, "40712")


def test_retrieval_fraction_is_a_checked_config_field(tmp_path):
    cfg = base.get_config()
    cfg.data.retrieval_fraction = 1.5
    with pytest.raises(config.ConfigError, match="retrieval_fraction=1.5 is invalid"):
        config.parse(cfg)
    cfg.data.retrieval_fraction = 0.25
    typed = config.parse(cfg)
    assert isinstance(data.retrieval_mix(typed.data, BYTES, 64, 0), retrieval.Mix)
    with pytest.raises(data.DataError, match="needs a tokenizer"):
        data.retrieval_mix(typed.data, None, 64, 0)
    with pytest.raises(data.DataError, match="longer than 17"):
        data.retrieval_mix(typed.data, BYTES, 16, 0)
