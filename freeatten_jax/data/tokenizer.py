"""Tokenizers: bytes (vocab 256, the default), a byte-level BPE trained locally, or a Hugging Face
`tokenizer.json` file (e.g. GPT-2's, for .bin token shards, or an imported model's own for text).

The BPE is saved as JSON beside the data, which may be on cloud storage (an `etils.epath` path). Every
run also saves its tokenizer in its own folder (RUN_FILE), so a run can be evaluated without its data.
"""

import json

import numpy as np
from etils import epath

from freeatten_jax.errors import UserError

RUN_FILE = "tokenizer.json"  # in the run folder: {"kind": "byte" | "bpe" | "file", "hf": the HF tokenizer JSON or null}


class TokenizerFileError(UserError, FileNotFoundError):
    """A tokenizer file that is not there."""


class ByteTokenizer:
    """UTF-8 bytes as tokens."""

    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.uint16)

    def decode(self, ids) -> str:
        """Ids past the bytes (the document separator of document masking) decode to nothing."""
        ids = np.asarray(ids)
        return bytes(ids[ids < 256].astype(np.uint8).tolist()).decode("utf-8", errors="replace")


class FileTokenizer:
    """A Hugging Face `tokenizer.json` (any model, e.g. GPT-2's byte-level BPE), encoding text as a whole."""

    def __init__(self, path: epath.PathLike = "", text: str | None = None):
        from tokenizers import Tokenizer

        if text is None and not epath.Path(path).exists():
            raise TokenizerFileError(f"tokenizer file {str(path)!r} does not exist")
        self._tok = Tokenizer.from_str(epath.Path(path).read_text() if text is None else text)
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, np.int64)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])

    def to_str(self) -> str:
        return self._tok.to_str()


class BpeTokenizer(FileTokenizer):
    """A byte-level BPE (HF `tokenizers`), trained on the training text and saved as JSON beside the data;
    encodes line by line (training text is long)."""

    def __init__(self, path: epath.PathLike = "", vocab_size: int = 0, train_texts=None, text: str | None = None):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        path = epath.Path(path)
        if text is None and path.exists():
            text = path.read_text()
        elif text is None and train_texts is None:
            raise FileNotFoundError(f"BPE tokenizer {path} not found and no text given to train it")
        elif text is None:
            tok = Tokenizer(models.BPE())
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            alphabet = pre_tokenizers.ByteLevel.alphabet()
            trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
            tok.train_from_iterator(train_texts, trainer=trainer)
            text = tok.to_str()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        super().__init__(text=text)

    def encode(self, text: str) -> np.ndarray:
        lines = text.splitlines(keepends=True)
        ids = [i for enc in self._tok.encode_batch(lines) for i in enc.ids]
        return np.asarray(ids, np.uint16)


def bpe_path(data_dir: epath.PathLike, vocab_size: int) -> epath.Path:
    return epath.Path(data_dir) / f"bpe-{vocab_size}.json"


def byte_tokenizer(cfg_data, data_dir, train_texts=None):
    return ByteTokenizer()


def bpe_tokenizer(cfg_data, data_dir, train_texts=None):
    return BpeTokenizer(bpe_path(data_dir, cfg_data.bpe_vocab_size), cfg_data.bpe_vocab_size, train_texts)


def file_tokenizer(cfg_data, data_dir=None, train_texts=None):
    """data.tokenizer_path, a Hugging Face tokenizer.json: an imported model's own tokenizer for text data."""
    if not cfg_data.tokenizer_path:
        raise TokenizerFileError("config.data.tokenizer=file needs config.data.tokenizer_path, a Hugging Face tokenizer.json")
    return FileTokenizer(cfg_data.tokenizer_path)


# the text sources' tokenizers by data.tokenizer: (config.data, the data's folder, training texts to fit on) -> tokenizer
TOKENIZERS = {"byte": byte_tokenizer, "bpe": bpe_tokenizer, "file": file_tokenizer}
KINDS = {ByteTokenizer: "byte", BpeTokenizer: "bpe", FileTokenizer: "file"}


def loss_unit(tokenizer) -> str:
    """The unit of a loss over `tokenizer`'s tokens, as reports state it: a byte tokenizer's token is a byte."""
    return "nats per byte" if isinstance(tokenizer, ByteTokenizer) else "nats per token"


def save_to_run(tokenizer, run_dir: epath.PathLike) -> None:
    """Writes the tokenizer into the run folder (nothing for a run without one)."""
    if tokenizer is None:
        return
    kind = KINDS[type(tokenizer)]
    saved = {"kind": kind, "hf": None if kind == "byte" else json.loads(tokenizer.to_str())}
    run_dir = epath.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_FILE).write_text(json.dumps(saved))


LOADERS = {"byte": lambda hf: ByteTokenizer(), "bpe": lambda hf: BpeTokenizer(text=hf), "file": lambda hf: FileTokenizer(text=hf)}


def load_from_run(run_dir: epath.PathLike):
    """The tokenizer saved in a run folder, or None if the run saved none."""
    path = epath.Path(run_dir) / RUN_FILE
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    return LOADERS[saved["kind"]](None if saved["hf"] is None else json.dumps(saved["hf"]))
