"""Where the tokens come from: the default corpus, user text files, or .bin token shards.

Every source yields a train and a validation list of 1-D token sequences. The split is deterministic:
the last `val_fraction` of each text file or shard is held out (or the `val_path` shards, if given).
"""
import dataclasses
import glob
import pathlib

import numpy as np
from etils import epath

from freeatten_jax.data import corpus, shards
from freeatten_jax.data.tokenizer import TOKENIZERS, FileTokenizer, load_from_run
from freeatten_jax.errors import UserError

GPT2_VOCAB = 50257  # the token ids in llm.c / modded-nanogpt FineWeb shards


class DataError(UserError, ValueError):
    """The data configuration points at nothing usable."""


@dataclasses.dataclass
class Splits:
    train: list  # 1-D token sequences (np.ndarray or shards.Shard)
    val: list
    vocab_size: int  # tokens are in [0, vocab_size)
    tokenizer: object | None  # encode/decode; None for pre-tokenized shards without data.tokenizer_path


def _glob(pattern: str, field: str) -> list:
    """The files matching a local glob, or a cloud one (`gs://bucket/dir/*.txt`: wildcards in the name only)."""
    if "://" in pattern:
        folder, _, name = pattern.rpartition("/")
        paths = sorted(p for p in epath.Path(folder).glob(name) if p.is_file()) if epath.Path(folder).exists() else []
    else:
        paths = sorted(pathlib.Path(p) for p in glob.glob(str(pathlib.Path(pattern).expanduser())) if pathlib.Path(p).is_file())
    if not pattern or not paths:
        raise DataError(f"config.data.{field}={pattern!r} matches no file; set it to a glob of existing files")
    return paths


def _split_point(n: int, val_fraction: float) -> int:
    return n - int(round(n * val_fraction))


def _text_splits(paths, cfg, data_dir: pathlib.Path) -> Splits:
    texts = [p.read_bytes().decode("utf-8", errors="replace") for p in paths]
    cut = [_split_point(len(t), cfg.val_fraction) for t in texts]
    tok = TOKENIZERS[cfg.tokenizer](data_dir, cfg.bpe_vocab_size, [t[:c] for t, c in zip(texts, cut)])
    train = np.concatenate([tok.encode(t[:c]) for t, c in zip(texts, cut)])
    val = np.concatenate([tok.encode(t[c:]) for t, c in zip(texts, cut)])
    return Splits([train], [val], tok.vocab_size, tok)


def _shakespeare_dir(cfg):
    return corpus.shakespeare_files(cfg.cache_dir)[0].parent.parent


def _text_dir(cfg):
    return _glob(cfg.path, "path")[0].parent


TEXT_DIRS = {"shakespeare": _shakespeare_dir, "text": _text_dir}  # where a text source keeps its trained tokenizer


def shakespeare(cfg) -> Splits:
    return _text_splits(corpus.shakespeare_files(cfg.cache_dir), cfg, _shakespeare_dir(cfg))


def text(cfg) -> Splits:
    return _text_splits(_glob(cfg.path, "path"), cfg, _text_dir(cfg))


def bin_shards(cfg) -> Splits:
    train = [shards.Shard(p) for p in _glob(cfg.path, "path")]
    if cfg.val_path:
        val = [shards.Shard(p) for p in _glob(cfg.val_path, "val_path")]
    else:
        cuts = [_split_point(len(s), cfg.val_fraction) for s in train]
        train, val = [shards.Shard(s.path, 0, c) for s, c in zip(train, cuts)], [shards.Shard(s.path, c) for s, c in zip(train, cuts)]
    return Splits(train, val, GPT2_VOCAB, _file_tokenizer(cfg))


def _file_tokenizer(cfg):
    """The Hugging Face tokenizer file of .bin shards (data.tokenizer_path), or None if none is given."""
    if not cfg.tokenizer_path:
        return None
    if not epath.Path(cfg.tokenizer_path).exists():
        raise DataError(f"config.data.tokenizer_path={cfg.tokenizer_path!r} does not exist; give a Hugging Face tokenizer.json")
    return FileTokenizer(cfg.tokenizer_path)


SOURCES = {"shakespeare": shakespeare, "text": text, "bin": bin_shards}


def vocab_size(cfg_data) -> int:
    """The vocabulary the configured data uses, known before loading it (tokens are below it)."""
    if cfg_data.source == "bin":
        return GPT2_VOCAB
    return 256 if cfg_data.tokenizer == "byte" else cfg_data.bpe_vocab_size


def tokenizer(cfg_data):
    """The tokenizer a run trained with, without reading its data (None for .bin shards without data.tokenizer_path)."""
    if cfg_data.source not in TEXT_DIRS:
        return _file_tokenizer(cfg_data)
    return TOKENIZERS[cfg_data.tokenizer](TEXT_DIRS[cfg_data.source](cfg_data), cfg_data.bpe_vocab_size)


def run_tokenizer(workdir, cfg_data):
    """The tokenizer saved in the run folder; for runs saved before runs kept one, the configured one."""
    saved = load_from_run(workdir)
    return saved if saved is not None else tokenizer(cfg_data)


def load_splits(cfg_data) -> Splits:
    """Train and validation tokens for `config.data`."""
    return SOURCES[cfg_data.source](cfg_data)
