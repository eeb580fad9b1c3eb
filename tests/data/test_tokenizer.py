"""Every run carries its tokenizer: byte, locally trained BPE, or a Hugging Face tokenizer.json file
(data.tokenizer_path, for .bin shards), saved in the run folder and loaded back identically."""

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from freeatten_jax import data
from freeatten_jax.configs import base
from freeatten_jax.data.tokenizer import BpeTokenizer, ByteTokenizer, FileTokenizer, load_from_run
from freeatten_jax.training import config

TEXT = "The pass key is 40712. Remember it.\nWhat is the pass key? The pass key is 40712\n"


def _word_level_file(path):
    """A tokenizer.json built here with the `tokenizers` library (a word-level vocabulary)."""
    words = sorted(set(TEXT.replace(".", " . ").replace("?", " ? ").split()))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tok.save(str(path))
    return path


def _cfg_data(**kw):
    cfg = base.get_config()
    cfg.data.update(kw)
    return config.parse(cfg).data


def _roundtrip(tok, run_dir):
    data.save_to_run(tok, run_dir)
    loaded = load_from_run(run_dir)
    assert type(loaded) is type(tok) and loaded.vocab_size == tok.vocab_size
    np.testing.assert_array_equal(loaded.encode(TEXT), tok.encode(TEXT))
    assert loaded.decode(loaded.encode(TEXT)) == tok.decode(tok.encode(TEXT))
    return loaded


def test_byte_and_bpe_tokenizers_round_trip_through_the_run_folder(tmp_path):
    assert _roundtrip(ByteTokenizer(), tmp_path / "byte").decode(ByteTokenizer().encode(TEXT)) == TEXT
    bpe = BpeTokenizer(tmp_path / "bpe.json", 300, [TEXT * 20])
    loaded = _roundtrip(bpe, tmp_path / "bpe-run")
    assert loaded.decode(loaded.encode(TEXT)) == TEXT and len(loaded.encode(TEXT)) < len(TEXT.encode())  # merges survived
    assert load_from_run(tmp_path / "nothing-saved") is None


def test_bin_shards_take_a_tokenizer_file_and_runs_save_it(tmp_path):
    path = _word_level_file(tmp_path / "tokenizer.json")
    data.write_shard(tmp_path / "train.bin", np.arange(500) % 20)
    cfg_data = _cfg_data(source="bin", path=str(tmp_path / "train.bin"), tokenizer_path=str(path))
    splits = data.load_splits(cfg_data)
    ids = splits.tokenizer.encode("What is the pass key ?")
    assert splits.tokenizer.decode(ids) == "What is the pass key ?" and len(ids) == 6  # words, not bytes
    loaded = _roundtrip(splits.tokenizer, tmp_path / "run")
    assert isinstance(loaded, FileTokenizer)
    assert type(data.run_tokenizer(tmp_path / "run", cfg_data)) is FileTokenizer
    without = _cfg_data(source="bin", path=str(tmp_path / "train.bin"))
    assert data.load_splits(without).tokenizer is None and data.run_tokenizer(tmp_path / "empty", without) is None
    with pytest.raises(data.DataError, match="tokenizer_path='/nope.json' does not exist"):
        data.load_splits(_cfg_data(source="bin", path=str(tmp_path / "train.bin"), tokenizer_path="/nope.json"))


def test_the_tokenizer_module_is_not_shadowed_by_a_function():
    import types

    import freeatten_jax.data as data_package
    from freeatten_jax.data import tokenizer

    assert isinstance(tokenizer, types.ModuleType) and data_package.tokenizer is tokenizer and tokenizer.ByteTokenizer


def test_a_runs_loss_unit_is_per_byte_for_the_byte_tokenizer_only(tmp_path):
    assert data.loss_unit(ByteTokenizer()) == "nats per byte"
    bpe = BpeTokenizer(tmp_path / "bpe.json", 260, [TEXT])
    assert [data.loss_unit(t) for t in (bpe, FileTokenizer(text=bpe.to_str()), None)] == ["nats per token"] * 3
