"""Tokenizers for text sources: bytes (vocab 256, the default) or a byte-level BPE trained locally.

The BPE is saved as JSON beside the data, which may be on cloud storage (an `etils.epath` path).
"""
import numpy as np
from etils import epath


class ByteTokenizer:
    """UTF-8 bytes as tokens."""

    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.uint16)

    def decode(self, ids) -> str:
        """Ids past the bytes (the document separator of document masking) decode to nothing."""
        ids = np.asarray(ids)
        return bytes(ids[ids < 256].astype(np.uint8).tolist()).decode("utf-8", errors="replace")


class BpeTokenizer:
    """A byte-level BPE (HF `tokenizers`), trained on the training text and saved as JSON beside the data."""

    def __init__(self, path: epath.PathLike, vocab_size: int, train_texts=None):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        path = epath.Path(path)
        if path.exists():
            self._tok = Tokenizer.from_str(path.read_text())
        elif train_texts is None:
            raise FileNotFoundError(f"BPE tokenizer {path} not found and no text given to train it")
        else:
            self._tok = Tokenizer(models.BPE())
            self._tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            self._tok.decoder = decoders.ByteLevel()
            alphabet = pre_tokenizers.ByteLevel.alphabet()
            trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
            self._tok.train_from_iterator(train_texts, trainer=trainer)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self._tok.to_str())
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        lines = text.splitlines(keepends=True)
        ids = [i for enc in self._tok.encode_batch(lines) for i in enc.ids]
        return np.asarray(ids, np.uint16)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])


def bpe_path(data_dir: epath.PathLike, vocab_size: int) -> epath.Path:
    return epath.Path(data_dir) / f"bpe-{vocab_size}.json"


def byte_tokenizer(data_dir, vocab_size, train_texts=None):
    return ByteTokenizer()


def bpe_tokenizer(data_dir, vocab_size, train_texts=None):
    return BpeTokenizer(bpe_path(data_dir, vocab_size), vocab_size, train_texts)


TOKENIZERS = {"byte": byte_tokenizer, "bpe": bpe_tokenizer}
