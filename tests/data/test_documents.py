"""Document masking: segment ids and positions from EOS, the sources' separators and defaults, packed
losses equal to per-document runs, and exact resume of a document-masked run on .bin shards."""

import traceback

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import read_metrics

from freeatten_jax import data
from freeatten_jax.configs import base
from freeatten_jax.data import documents
from freeatten_jax.errors import ConfigError
from freeatten_jax.nn import Transformer, preset
from freeatten_jax.training import config, loop
from freeatten_jax.training.loss import next_token_losses

EOS = data.sources.GPT2_EOS


def test_segments_restart_at_each_eos():
    """Before the first EOS: segment 0, positions from the window start; each EOS is position 0 of its document."""
    tokens_BT = np.array([[5, 6, 9, 7, 8, 1, 9, 9, 3], [9, 1, 2, 9, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 0]])
    segment_ids_BT, positions_BT = documents.segments(tokens_BT, 9)
    np.testing.assert_array_equal(segment_ids_BT, [[0, 0, 1, 1, 1, 1, 2, 3, 3], [1, 1, 1, 2, 2, 2, 2, 2, 2], [0] * 9])
    np.testing.assert_array_equal(positions_BT, [[0, 1, 0, 1, 2, 3, 0, 0, 1], [0, 1, 2, 0, 1, 2, 3, 4, 5], list(range(9))])
    assert documents.model_inputs(tokens_BT, None) == {}


def _document_stream(rng, num_docs):
    """EOS-opened documents whose tokens are doc * 100 + position (position 1..): each token names its document."""
    docs = [[EOS] + [d * 100 + j for j in range(1, rng.integers(2, 40))] for d in range(num_docs)]
    return np.concatenate(docs)


def test_training_windows_of_a_bin_shard_get_per_document_segments_and_positions(tmp_path):
    data.write_shard(tmp_path / "s.bin", _document_stream(np.random.default_rng(0), 300))
    windows_BL = next(data.train_iterator([data.Shard(tmp_path / "s.bin")], 63, 64, seed=0))
    segment_ids_BL, positions_BL = map(np.asarray, documents.segments(windows_BL, EOS))
    doc_BL = windows_BL // 100
    after_BL = np.concatenate([doc_BL[:, 1:], doc_BL[:, -2:-1] + 1], axis=1)  # the next token's doc (past the end: one more)
    doc_BL = np.where(windows_BL == EOS, after_BL, doc_BL)  # an EOS belongs to the document it opens
    offset_BL = np.where(windows_BL == EOS, 0, windows_BL % 100)  # the token's position in its whole document
    for doc_L, seg_L, pos_L, off_L in zip(doc_BL, segment_ids_BL, positions_BL, offset_BL):
        np.testing.assert_array_equal(doc_L[:, None] == doc_L[None], seg_L[:, None] == seg_L[None])  # same segment iff same doc
        np.testing.assert_array_equal(pos_L, np.minimum(off_L, np.arange(64)))  # clipped at the window start
    assert (windows_BL == EOS).any(axis=1).all() and (positions_BL[:, 0] == 0).all()


def _data_cfg(**kw):
    return config.DataConfig(
        **{
            **dict(
                source="text",
                path="",
                val_path="",
                tokenizer="byte",
                bpe_vocab_size=300,
                val_fraction=0.25,
                cache_dir="",
                num_workers=0,
            ),
            **kw,
        }
    )


def test_text_sources_open_each_file_with_a_new_eos_token(tmp_path):
    (tmp_path / "a.txt").write_text("abcdefgh")
    (tmp_path / "b.txt").write_text("ijkl")
    splits = data.load_splits(_data_cfg(path=str(tmp_path / "*.txt"), document_masking="on"))
    assert splits.train[0].tolist() == [256, *b"abcdef", 256, *b"ijk"] and splits.val[0].tolist() == [256, *b"gh", 256, *b"l"]
    assert splits.vocab_size == 257 and splits.tokenizer.decode(splits.train[0]) == "abcdefijk"
    off = data.load_splits(_data_cfg(path=str(tmp_path / "*.txt")))
    assert off.train[0].tolist() == [*b"abcdef", *b"ijk"] and off.vocab_size == 256
    chosen = data.load_splits(_data_cfg(path=str(tmp_path / "*.txt"), document_masking="on", eos_id=10))
    assert chosen.train[0].tolist() == [10, *b"abcdef", 10, *b"ijk"] and chosen.vocab_size == 256


@pytest.mark.parametrize(
    "size, overrides, eos, vocab",
    [
        ("tiny", {}, None, 256),  # the byte-level Shakespeare demo: off
        ("tiny", {"data.source": "bin", "data.path": "x.bin"}, EOS, 50257),  # .bin shards: on, GPT-2's EOS
        ("gpt2_small", {"data.path": "x.bin"}, EOS, 50257),
        ("tiny", {"data.document_masking": "on"}, 256, 257),  # a new token past the bytes
        ("tiny", {"data.document_masking": "on", "data.tokenizer": "bpe"}, 4096, 4097),
        ("tiny", {"data.source": "bin", "data.path": "x.bin", "data.document_masking": "off"}, None, 50257),
    ],
)
def test_document_masking_is_on_by_default_for_bin_shards_only(size, overrides, eos, vocab):
    cfg = base.get_config("lssar", size)
    cfg.update_from_flattened_dict(overrides)
    parsed = config.parse(cfg)
    assert data.document_eos(parsed.data) == eos and parsed.model.vocab_size == vocab


@pytest.mark.parametrize("field, value", [("document_masking", "yes"), ("eos_id", -2), ("eos_id", 65536)])
def test_bad_document_masking_options_are_named(field, value):
    cfg = base.get_config("softmax", "tiny")
    cfg.data[field] = value
    with pytest.raises(ConfigError, match=rf"config\.data\.{field}={value!r} is invalid"):
        config.parse(cfg)


@pytest.mark.parametrize("variant", ["lssar", "ssmax"])
def test_packed_losses_equal_each_document_run_alone(variant):
    """A window holding the tail of one document and two whole ones: with document masking, every token's
    loss equals that of its document run alone (N_i and RoPE restart per document); without, it does not."""
    cfg = preset(
        "tiny", num_layers=1, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=64, vocab_size=40, max_len=16, attention=variant
    )
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    eos = 39
    tail, first, second = [5, 17, 3, 26], [eos, 8, 30, 1], [eos, 11, 4, 9, 13]  # the window ends with `second`
    window = jnp.array([tail + first + second])
    separate = jnp.array([tail + [eos], first + [eos], second])  # each document's window: its tokens, then the next EOS
    losses = nnx.jit(
        lambda m: (next_token_losses(m, window, eos_id=eos)[0], next_token_losses(m, separate), next_token_losses(m, window)[0])
    )
    losses, alone, unmasked = losses(model)
    np.testing.assert_allclose(losses, alone.reshape(-1), rtol=1e-5, atol=1e-5)
    assert not np.allclose(unmasked[len(tail) :], alone[1:].reshape(-1), atol=1e-3)


@pytest.mark.slow  # three short training runs
def test_document_masked_run_on_bin_shards_resumes_exactly(tmp_path, monkeypatch):
    """Masking on by default for .bin; 3 steps, then resumed to 6, equal a straight 6-step run, loss for loss."""
    data.write_shard(tmp_path / "train.bin", _document_stream(np.random.default_rng(0), 400))
    seen = []
    segments = documents.segments

    def spy(tokens, eos_id):  # which steps trace document masking, with which EOS
        callers = {frame.name for frame in traceback.extract_stack()}
        seen.append((eos_id, "train_step" in callers, "eval_step" in callers))
        return segments(tokens, eos_id)

    monkeypatch.setattr(documents, "segments", spy)
    cfg = base.get_config("ssmax", "tiny")
    cfg.update_from_flattened_dict(
        {
            "model.num_layers": 1,
            "model.d_model": 32,
            "model.num_heads": 2,
            "model.mlp_dim": 64,
            "data.source": "bin",
            "data.path": str(tmp_path / "train.bin"),
            "data.val_fraction": 0.2,
            "train.seq_len": 16,
            "train.batch_size": 8,
            "train.steps": 6,
            "train.log_every": 1,
            "train.eval_every": 3,
            "train.eval_windows": 8,
            "train.checkpoint_every": 100,
            "optim.schedule": "constant",
            "optim.warmup_steps": 2,
            "optim.lr": 1e-2,
            "mesh.shape": (1, 1, 1),
        }
    )
    loop.train_and_evaluate(cfg, tmp_path / "straight")
    assert set(seen) == {(EOS, True, False), (EOS, False, True)}
    cfg.train.steps = 3
    assert [m["step"] for m in loop.train_and_evaluate(cfg, tmp_path / "resumed")] == [1, 2, 3]
    cfg.train.steps = 6
    assert [m["step"] for m in loop.train_and_evaluate(cfg, tmp_path / "resumed")] == [4, 5, 6]
    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [(m["step"], m["loss"], m.get("val_loss")) for m in straight] == [
        (m["step"], m["loss"], m.get("val_loss")) for m in resumed
    ]
