"""A run folder's record of its progress beside the checkpoints: metrics.jsonl's step rows and confirmed.json (and the
TensorBoard events). A run whose checkpoints are gone still shows how far it went (`progress`); a start from step 0
moves the earlier run's records aside whole, to WORKDIR/previous/N/ (`move_aside`), so that no history is rewritten away."""

import json

import jax

from freeatten_jax.training import storage

RECORDS = ("metrics.jsonl", "confirmed.json", "tensorboard", "wandb.json", "wandb")  # wandb*: wandb_log.RUN_FILE, its files
PREVIOUS = "previous"  # WORKDIR/previous/1, 2, ...: the records of each earlier run that a fresh start replaced


def _last_logged_step(path) -> int | None:
    """The largest step of metrics.jsonl's step records (other lines, torn or foreign, are skipped quietly: the writer
    reports them when it reads the file)."""
    steps = []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            steps.append(row["step"])
    return max(steps, default=None)


def _confirmed(path) -> str:
    """confirmed.json as its step, if it can be read (a damaged one still says a checkpoint was confirmed)."""
    try:
        step = json.loads(path.read_text())["step"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return path.name
    return f"{path.name}: step {step}"


def progress(workdir) -> str | None:
    """What shows that WORKDIR's run trained ("metrics.jsonl to step 20, confirmed.json: step 18"), or None."""
    root, shown = storage.path(workdir), []
    if (root / "metrics.jsonl").exists() and (step := _last_logged_step(root / "metrics.jsonl")) is not None:
        shown.append(f"metrics.jsonl to step {step}")
    if (root / "confirmed.json").exists():
        shown.append(_confirmed(root / "confirmed.json"))
    return ", ".join(shown) or None


def move_aside(workdir):
    """Moves the records there are to WORKDIR/previous/N/, N the first free number (process 0); returns that folder, or
    None when there was nothing to move."""
    root = storage.path(workdir)
    present = [name for name in RECORDS if (root / name).exists()]
    if not present:
        return None
    number = 1
    while (root / PREVIOUS / str(number)).exists():
        number += 1
    target = root / PREVIOUS / str(number)
    if jax.process_index() == 0:
        target.mkdir(parents=True)
        for name in present:
            (root / name).rename(target / name)
    return target
