"""A Hugging Face `datasets` dataset as text documents (data.source=hf): by name from the Hub (network), or its
.parquet / .arrow / .jsonl files on disk (offline). Each row's `data.hf_column` is one document. `datasets` is
imported only here, so that the other sources do not need the extra that installs it."""

import pathlib

from freeatten_jax.data import corpus
from freeatten_jax.errors import UserError

# the `datasets` builder that reads each kind of local file
BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json"}
EXTRA = "pip install 'freeatten_jax[datasets]'"


class DatasetError(UserError, ValueError):
    """data.source=hf names nothing `datasets` can load, or rows without the text column."""


def is_files(path: str) -> bool:
    """Whether data.path names local files (a glob, or a file's extension) rather than a dataset on the Hub."""
    return pathlib.PurePath(path).suffix in BUILDERS or any(c in path for c in "*?[")


def tokenizer_dir(cfg_data, files: list) -> pathlib.Path:
    """Where a BPE trained on the dataset is kept: beside its files, or in the cache for a dataset on the Hub."""
    return files[0].parent if files else corpus.cache_root(cfg_data.cache_dir) / "datasets" / cfg_data.path.replace("/", "--")


def documents(cfg_data, files: list) -> list[str]:
    """The `data.hf_column` text of every row of split `data.hf_split`: of `files` (all of one kind), else of the Hub
    dataset data.path (subset data.hf_subset); downloads and Arrow caches go under data.cache_dir."""
    try:
        import datasets
    except ModuleNotFoundError:
        raise DatasetError(f"data.source=hf needs the datasets package: {EXTRA}") from None
    datasets.disable_progress_bars()
    where = f"config.data.path={cfg_data.path!r}"
    if other := next((f for f in files if pathlib.PurePath(f).suffix not in BUILDERS), None):
        *first, last = BUILDERS
        raise DatasetError(f"{where} matches {other}, which is not a {', '.join(first)} or {last} file")
    kinds = sorted({BUILDERS[pathlib.PurePath(f).suffix] for f in files})
    if len(kinds) > 1:
        raise DatasetError(f"{where} matches files of several kinds ({', '.join(kinds)}); give one kind")
    name, subset = (kinds[0], None) if files else (cfg_data.path, cfg_data.hf_subset or None)
    cache = str(corpus.cache_root(cfg_data.cache_dir) / "datasets")
    try:
        rows = datasets.load_dataset(
            name, subset, data_files=[str(f) for f in files] or None, split=cfg_data.hf_split, cache_dir=cache
        )
    except Exception as e:  # network, a name or split that does not exist, unreadable files: many types
        line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DatasetError(f"{where}: datasets cannot load split {cfg_data.hf_split!r} ({line})") from None
    if cfg_data.hf_column not in rows.column_names:
        raise DatasetError(
            f"{where}: no column {cfg_data.hf_column!r} (it has {', '.join(rows.column_names)}); set config.data.hf_column"
        )
    texts = rows[cfg_data.hf_column]
    if (bad := next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)) is not None:
        raise DatasetError(f"{where}: row {bad}'s {cfg_data.hf_column!r} is {type(texts[bad]).__name__}, not text")
    return list(texts)
