"""Run outputs on cloud storage: `gs://` paths go through etils.epath (never a local `./gs:` folder).

The `gs` protocol is served by an in-memory fsspec filesystem, so these paths are real non-POSIX
epath paths exercised end to end (listing, writing, reading), not strings.
"""

import numpy as np
import pytest
from etils import epath
from etils.epath import backend
from fsspec import register_implementation
from fsspec.implementations.memory import MemoryFileSystem
from helpers import read_metrics

from freeatten_jax import data
from freeatten_jax.data.tokenizer import BpeTokenizer
from freeatten_jax.training import checkpoint, metrics, run_dir, storage
from freeatten_jax.training.config import DataConfig


class FakeGcs(MemoryFileSystem):
    """An in-memory stand-in for Google Cloud Storage (`gs://bucket/...`)."""

    protocol = ("gs", "gcs")
    root_marker = ""
    store, pseudo_dirs = {}, [""]

    @classmethod
    def _strip_protocol(cls, path):
        """'gs://bucket/x' -> 'bucket/x', as gcsfs does (epath adds 'gs://' back to what it lists)."""
        path = str(path).removeprefix("gs://").removeprefix("gcs://")
        return path.rstrip("/")


@pytest.fixture
def gcs(monkeypatch, tmp_path):
    for name in FakeGcs.protocol:
        register_implementation(name, FakeGcs, clobber=True)
    backend.fsspec_backend._get_filesystem.cache_clear()
    monkeypatch.setattr(epath.gpath, "_is_tf_installed", lambda: False, raising=False)
    monkeypatch.chdir(tmp_path)  # a wrong, local `gs:` folder would appear here
    FakeGcs.store.clear()
    yield FakeGcs()
    FakeGcs.store.clear()
    backend.fsspec_backend._get_filesystem.cache_clear()
    assert not (tmp_path / "gs:").exists()


def test_cloud_paths_stay_cloud_paths_and_local_ones_become_absolute(gcs, tmp_path):
    assert str(storage.path("gs://bucket/run")) == "gs://bucket/run"
    assert storage.path("run") == epath.Path(tmp_path / "run")


def test_metrics_and_tensorboard_written_to_cloud_storage_and_truncated_on_resume(gcs):
    writer = metrics.MetricsWriter("gs://bucket/run", config={"train": {"steps": 3}})
    for step in (1, 2, 3):
        writer.write(step, {"loss": 1.0 / step})
    writer.close()
    assert [m["step"] for m in read_metrics("gs://bucket/run")] == [1, 2, 3]
    events = gcs.glob("bucket/run/tensorboard/events.out.tfevents.*")
    assert events and gcs.cat(events[0]).count(b"loss") == 3 and b"train" in gcs.cat(events[0])  # scalars and the config
    metrics.MetricsWriter("gs://bucket/run", resumed_step=2).close()
    assert [m["step"] for m in read_metrics("gs://bucket/run")] == [1, 2]


def test_text_data_and_its_bpe_tokenizer_on_cloud_storage(gcs):
    text = "the king and the queen speak of love and night\n" * 60
    gcs.pipe("bucket/data/a.txt", text.encode())
    cfg = DataConfig(
        source="text",
        path="gs://bucket/data/*.txt",
        val_path="",
        tokenizer="bpe",
        bpe_vocab_size=300,
        val_fraction=0.1,
        cache_dir="",
        num_workers=0,
    )
    splits = data.load_splits(cfg)
    assert gcs.exists("bucket/data/bpe-300.json")  # trained and saved beside the data, on the bucket
    assert splits.tokenizer.decode(splits.train[0]) + splits.tokenizer.decode(splits.val[0]) == text
    again = BpeTokenizer(epath.Path("gs://bucket/data/bpe-300.json"), 300)  # loaded back, not retrained
    np.testing.assert_array_equal(again.encode(text), splits.tokenizer.encode(text))
    assert data.configured_tokenizer(cfg).encode("king").tolist() == again.encode("king").tolist()


def test_checkpoint_folder_is_on_cloud_storage(gcs, monkeypatch):
    from orbax.checkpoint._src.path import gcs_utils  # asks the real bucket (google-cloud-storage) for its namespace type

    monkeypatch.setattr(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False)
    ckpt = checkpoint.Checkpointer("gs://bucket/run")
    assert str(ckpt.directory) == "gs://bucket/run/checkpoints" and ckpt.latest_step() is None
    ckpt.close()
    with pytest.raises(checkpoint.CheckpointNotFoundError, match="gs://bucket/run/checkpoints"):
        run_dir.load_params("gs://bucket/run")
