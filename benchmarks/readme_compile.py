"""docs/training.md's `freeatten-compile` example run as a user runs it: gpt2_small LSSAR's training step on a v5p-8 at its
default batch and at batch 32, each command's peak per chip and wall time written to a CSV that page cites.

    python benchmarks/readme_compile.py [--out benchmarks/readme_compile.csv] [--loaded]

Needs pip install -e '.[compile]'; minutes per command on 2 cores. --loaded marks the wall times as taken while other
jobs shared the CPU. Each row keeps the command's last line as printed.
"""

import argparse
import csv
import pathlib
import re
import subprocess
import sys
import time

COMMAND = ["--target=v5p-8", "--config=lssar:gpt2_small", "--config.model.implementation=pallas"]
CASES = {"512 (default)": [], "32": ["--config.train.batch_size=32"]}  # batch_size: the overrides (configs/base.py: 512)
FIELDS = ("command", "batch_size", "result", "peak_gib", "hbm_gib", "wall_s", "loaded", "printed")
PEAK = re.compile(r"peak (\d+\.\d+) GiB of (\d+\.\d+) GiB HBM")


def _row(batch_size: str, overrides: list[str], loaded: bool) -> dict:
    """Runs one command; its peak and HBM from the line the command prints, or its error line."""
    command = [str(pathlib.Path(sys.executable).parent / "freeatten-compile"), *COMMAND, *overrides]
    start = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.time() - start
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    peak = next((m for line in lines if (m := PEAK.search(line))), None)
    return {
        "command": " ".join(["freeatten-compile", *COMMAND, *overrides]),
        "batch_size": batch_size,
        "result": "ok" if done.returncode == 0 and peak else f"exit {done.returncode}",
        "peak_gib": peak.group(1) if peak else "",
        "hbm_gib": peak.group(2) if peak else "",
        "wall_s": f"{wall:.0f}",
        "loaded": "yes" if loaded else "no",
        "printed": lines[-1] if lines else "",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/readme_compile.csv")
    parser.add_argument("--loaded", action="store_true", help="other jobs shared the CPU while it ran")
    args = parser.parse_args(argv)
    rows = [_row(batch_size, overrides, args.loaded) for batch_size, overrides in CASES.items()]
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(" | ".join(str(row[k]) for k in FIELDS), flush=True)
    return 0 if all(row["result"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
