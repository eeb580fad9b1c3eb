"""Applies each mutant of the catalogue (tests/mutation/) alone, runs its tests, and reports whether they caught it.

Run on demand (not in CI) from the repository root: `make mutants`, or `python -m tests.mutation.run [-k SUBSTRING]`.
A mutant is caught when its tests fail. Files are restored after each mutant, also on Ctrl-C or SIGTERM;
the script refuses to start if a target file has uncommitted changes or a mutant's snippet is not found once.
"""

import argparse
import pathlib
import signal
import subprocess
import sys
import time

from . import MUTANTS, misplaced

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _check_targets(mutants) -> None:
    files = sorted({m.file for m in mutants})
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", *files], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    if dirty.strip():
        sys.exit(f"refusing to start: target files have uncommitted changes:\n{dirty}")
    if problems := misplaced(mutants, ROOT):
        sys.exit("\n".join(problems))


def _present(tests) -> tuple[list[str], list[str]]:
    """(pytest arguments whose paths exist, test paths missing on this branch)."""
    args, missing = [], []
    for arg in tests:
        is_path = arg.startswith("tests/")
        if is_path and not (ROOT / arg.split("::")[0]).exists():
            missing.append(arg)
        else:
            args.append(arg)
    return args, missing


def _run(mutant, timeout: int) -> tuple[str, str]:
    """(CAUGHT | SURVIVED | ERROR, detail) for one mutant, applied and then restored."""
    args, missing = _present(mutant.tests)
    note = f" (not on this branch: {', '.join(missing)})" if missing else ""
    if not any(a.startswith("tests/") for a in args):
        return "SURVIVED", "no catching test on this branch" + note
    path = ROOT / mutant.file
    original = path.read_text()
    try:
        path.write_text(original.replace(mutant.original, mutant.replacement))
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", *args]
        try:
            result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "ERROR", f"tests ran past {timeout} s"
    finally:
        path.write_text(original)
    failed = [line.split(" - ")[0].removeprefix("FAILED ") for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    if result.returncode == 1 and failed:
        return "CAUGHT", f"by {failed[0]}" + note
    if result.returncode == 0:
        return "SURVIVED", "tests passed" + note
    return "ERROR", f"pytest exit {result.returncode}: {result.stdout.strip().splitlines()[-1:]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="only", default="", help="run only mutants whose name contains this text")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per mutant's test run")
    options = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    mutants = [m for m in MUTANTS if options.only in m.name]
    _check_targets(mutants)
    began, counts = time.perf_counter(), {}
    for i, mutant in enumerate(mutants, 1):
        start = time.perf_counter()
        try:
            verdict, detail = _run(mutant, options.timeout)
        except KeyboardInterrupt:
            sys.exit(f"interrupted during {mutant.name!r}; {mutant.file} restored")
        counts[verdict] = counts.get(verdict, 0) + 1
        print(
            f"[{i}/{len(mutants)}] {verdict:8} {mutant.name} ({mutant.file}, {time.perf_counter() - start:.0f} s): {detail}",
            flush=True,
        )
    summary = ", ".join(f"{counts.get(v, 0)} {v.lower()}" for v in ("CAUGHT", "SURVIVED", "ERROR"))
    print(f"{len(mutants)} mutants: {summary}; total {time.perf_counter() - began:.0f} s")
    sys.exit(0 if counts.get("CAUGHT", 0) == len(mutants) else 1)


if __name__ == "__main__":
    main()
