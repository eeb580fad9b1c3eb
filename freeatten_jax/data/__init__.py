"""Data: the default Shakespeare corpus, user text, .bin token shards, MQAR, tokenizers, Grain pipelines, document masking."""

from freeatten_jax.data.corpus import CorpusError, cache_root, shakespeare_files
from freeatten_jax.data.mqar import PLACEMENTS as MQAR_PLACEMENTS
from freeatten_jax.data.pipeline import eval_windows, num_chunks, train_dataset, train_iterator
from freeatten_jax.data.shards import Shard, ShardError, read_header, write_shard
from freeatten_jax.data.sources import (
    DOCUMENT_MASKING,
    SOURCES,
    DataError,
    Splits,
    configured_tokenizer,
    document_eos,
    files,
    held_out_windows,
    load_splits,
    loss_targets,
    mqar_task,
    run_tokenizer,
    synthetic_windows,
    vocab_size,
)
from freeatten_jax.data.tokenizer import TOKENIZERS, loss_unit, save_to_run
from freeatten_jax.data.watch import DataChangedError, FileWatch


def retrieval_mix(cfg_data, tokenizer, seq_len: int, seed: int):
    """The training stream's retrieval mix (data.retrieval_fraction of the windows), or None."""
    from freeatten_jax.data.retrieval import Mix

    if not cfg_data.retrieval_fraction:
        return None
    if tokenizer is None:
        raise DataError("config.data.retrieval_fraction needs a tokenizer (set data.tokenizer_path for .bin shards)")
    try:
        return Mix(tokenizer, cfg_data.retrieval_fraction, seq_len + 1, seed)
    except ValueError as e:
        raise DataError(f"config.data.retrieval_fraction: {e} (the training window, seq_len + 1)") from None
