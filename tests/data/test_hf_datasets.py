"""data.source=hf: a Hugging Face `datasets` dataset's rows as documents, read offline from .parquet, .arrow and .jsonl
files the tests write (a dataset's name goes to `datasets.load_dataset`, checked with it replaced), through Grain into
training; bad input is one error line."""

import glob
import json
import sys

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import read_metrics, tiny_config

from freeatten_jax import data
from freeatten_jax.data import hf_datasets
from freeatten_jax.errors import UserError
from freeatten_jax.training import loop
from freeatten_jax.training.config import DataConfig

ROWS = ["the king is dead", "long live the queen", "thou art good", "what night", "speak, lady", "hear the sword"]
EOS = 256  # document masking is on for datasets by default: a new token past the bytes opens each row


def _cfg(tmp_path, path, **kw):
    return DataConfig(**{"source": "hf", "path": str(path), "val_fraction": 1 / 3, "cache_dir": str(tmp_path / "cache"), **kw})


def _write(folder, kind, rows, column="text"):
    """The rows as one file of `kind` (parquet, arrow as `datasets` saves it, jsonl), with an extra column."""
    folder.mkdir(parents=True, exist_ok=True)
    table = {column: rows, "id": list(range(len(rows)))}
    path = folder / f"rows.{kind}"
    if kind == "parquet":
        pq.write_table(pa.table(table), path)
    elif kind == "arrow":
        datasets.Dataset.from_dict(table).save_to_disk(str(folder / "saved"))
        (folder / "saved" / "data-00000-of-00001.arrow").rename(path)
    else:
        path.write_text("".join(json.dumps({column: r, "id": i}) + "\n" for i, r in enumerate(rows)))
    return path


def _documents(rows) -> np.ndarray:
    """The byte tokens of `rows`, each opened by EOS."""
    return np.concatenate([np.concatenate([[EOS], np.frombuffer(r.encode(), np.uint8)]) for r in rows]).astype(np.int64)


@pytest.mark.parametrize("kind", ["parquet", "arrow", "jsonl"])
def test_a_datasets_rows_are_documents_and_its_last_rows_are_held_out(kind, tmp_path):
    path = _write(tmp_path / "data", kind, ROWS)
    splits = data.load_splits(_cfg(tmp_path, tmp_path / "data" / f"*.{kind}"))
    np.testing.assert_array_equal(splits.train[0], _documents(ROWS[:4]))
    np.testing.assert_array_equal(splits.val[0], _documents(ROWS[4:]))
    assert splits.vocab_size == EOS + 1 and data.files(_cfg(tmp_path, path)) == [path]
    _write(tmp_path / "val", kind, ["the lord"])
    splits = data.load_splits(_cfg(tmp_path, path, val_path=str(tmp_path / "val" / f"*.{kind}"), document_masking="off"))
    assert splits.tokenizer.decode(splits.train[0]) == "".join(ROWS) and splits.tokenizer.decode(splits.val[0]) == "the lord"


def test_a_bpe_fitted_on_a_dataset_is_kept_beside_its_files(tmp_path):
    rows = ROWS * 20
    path = _write(tmp_path / "data", "parquet", rows)
    splits = data.load_splits(_cfg(tmp_path, path, tokenizer="bpe", bpe_vocab_size=270, document_masking="off"))
    assert (tmp_path / "data" / "bpe-270.json").exists() and len(splits.train[0]) < len("".join(rows[:80]))
    assert splits.tokenizer.decode(splits.train[0]) == "".join(rows[:80])


def test_a_dataset_name_is_loaded_from_the_hub_with_its_subset_and_split(tmp_path, monkeypatch):
    """Offline: `datasets.load_dataset` replaced, the name, subset, split and cache folder it is given are checked."""
    calls = []

    def load_dataset(name, subset, data_files, split, cache_dir):
        calls.append((name, subset, data_files, split, cache_dir))
        return datasets.Dataset.from_dict({"story": ROWS})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    cfg = _cfg(tmp_path, "roneneldan/TinyStories", hf_subset="default", hf_split="validation", hf_column="story")
    splits = data.load_splits(cfg)
    assert calls == [("roneneldan/TinyStories", "default", None, "validation", str(tmp_path / "cache" / "datasets"))]
    np.testing.assert_array_equal(splits.val[0], _documents(ROWS[4:]))
    assert data.files(cfg) == []  # nothing on disk to fingerprint


def test_a_run_trains_on_a_dataset_through_grain(text_glob, tmp_path):
    rows = [open(p).read() for p in sorted(glob.glob(text_glob))]
    _write(tmp_path / "data", "parquet", [line for text in rows for line in text.splitlines() if line])
    cfg = tiny_config("softmax", text_glob, **{"data.source": "hf", "data.path": str(tmp_path / "data" / "*.parquet")})
    cfg.data.cache_dir = str(tmp_path / "cache")
    loop.train_and_evaluate(cfg, tmp_path / "run")
    metrics = read_metrics(tmp_path / "run")
    assert metrics[-1]["loss"] < metrics[0]["loss"] and np.isfinite(metrics[-1]["val_loss"])


BAD = {
    "no such column": (
        lambda path: _cfg(path.parent.parent, path, hf_column="body"),
        "config.data.path='{path}': no column 'body' (it has text, id); set config.data.hf_column",
    ),
    "too few rows": (
        lambda path: _cfg(path.parent.parent, path, val_fraction=0.01),
        "config.data.path='{path}': 6 row(s) cannot be split into training and validation rows at "
        "config.data.val_fraction=0.01; give more rows or set config.data.val_path",
    ),
    "a split local files lack": (
        lambda path: _cfg(path.parent.parent, path, hf_split="test"),
        "config.data.path='{path}': datasets cannot load split 'test' (",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_dataset_settings_are_one_error_line(case, tmp_path):
    make, expected = BAD[case]
    path = _write(tmp_path / "data", "parquet", ROWS)
    with pytest.raises(UserError) as raised:
        data.load_splits(make(path))
    assert str(raised.value).startswith(expected.format(path=path)) and "\n" not in str(raised.value)


def test_files_of_several_kinds_and_rows_without_text_are_refused(tmp_path):
    _write(tmp_path / "data", "parquet", ROWS), _write(tmp_path / "data", "jsonl", ROWS)
    with pytest.raises(hf_datasets.DatasetError, match=r"matches files of several kinds \(json, parquet\); give one kind$"):
        data.load_splits(_cfg(tmp_path, tmp_path / "data" / "rows.*"))
    (tmp_path / "data" / "notes.txt").write_text("a")
    with pytest.raises(hf_datasets.DatasetError, match=r"notes.txt, which is not a .parquet, .arrow, .jsonl or .json file$"):
        data.load_splits(_cfg(tmp_path, tmp_path / "data" / "*"))
    pq.write_table(pa.table({"text": ["a", None, "b"]}), tmp_path / "none.parquet")
    with pytest.raises(hf_datasets.DatasetError, match=r"row 1's 'text' is NoneType, not text$"):
        data.load_splits(_cfg(tmp_path, tmp_path / "none.parquet"))


def test_without_the_datasets_package_the_source_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails as where it is not installed
    path = _write(tmp_path / "data", "jsonl", ROWS)
    with pytest.raises(hf_datasets.DatasetError) as raised:
        data.load_splits(_cfg(tmp_path, path))
    assert str(raised.value) == "data.source=hf needs the datasets package: pip install 'freeatten_jax[datasets]'"
