"""lm-evaluation-harness tasks over checkpoints x switches x multipliers (the `freeatten` model), each metric with the
project's interval over documents where the metric is a mean of per-document values; results as JSON and a report section.

The harness's own bootstrap is off (bootstrap_iters=0): it forks a process pool, and forking a JAX process can hang.
"""

import difflib
import json
import pathlib
import sys

import numpy as np

from freeatten_jax.errors import UserError
from freeatten_jax.evaluation import stats, switches
from freeatten_jax.evaluation.harness import FreeattenLM
from freeatten_jax.training import storage
from freeatten_jax.training.run_dir import load_run


def metrics(results: dict, task: str) -> dict:
    """{metric: {"value", "ci"}} of one task; "ci" is the 95% bootstrap interval over documents (stats.mean_with_interval)
    where the harness's value is the mean of the per-document values, else None (perplexities, bits per byte)."""
    out, samples = {}, results["samples"].get(task, [])  # no samples for a group of tasks
    for key, value in results["results"][task].items():
        name, sep, kept_by = key.partition(",")  # "acc,none": the metric and the filter its answers went through
        if not sep or name.endswith("_stderr") or not isinstance(value, int | float):
            continue
        per_doc = [sample.get(name) for sample in samples if sample.get("filter", kept_by) == kept_by]
        is_mean = bool(per_doc) and all(isinstance(v, int | float) for v in per_doc) and np.isclose(np.mean(per_doc), value)
        out[name] = {"value": float(value), "ci": stats.mean_with_interval(np.asarray(per_doc)[None])["ci"] if is_mean else None}
    return out


def evaluate(
    workdirs, switch_texts, multipliers, tasks, *, include_path=None, default_tasks=True, limit=None, **model_options
) -> list[dict]:
    """One row per checkpoint x applicable switch (the checkpoint as trained first) x multiplier: its metrics per task.
    Tasks are the harness's own (`default_tasks`; indexing them takes seconds) and those in the folder `include_path`."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path, include_defaults=default_tasks)
    if unknown := [task for task in tasks if task not in manager.all_tasks and not manager.match_tasks([task])]:
        close = difflib.get_close_matches(unknown[0], manager.all_tasks, n=1)
        where = "" if default_tasks else " (--nodefault_tasks: only --include_path's)"
        raise UserError(f"--tasks: no task {unknown[0]!r}{where}" + (f"; did you mean {close[0]!r}?" if close else ""))
    rows = []
    for workdir in workdirs:
        for switch in [switches.NONE, *map(switches.parse, switch_texts)]:
            run = load_run(workdir)  # fresh per switch: a switch changes the model in place
            if reason := switches.skipped(run.config, switch):
                print(f"{workdir}: {reason}", file=sys.stderr)
                continue
            for multiplier in multipliers:
                lm = FreeattenLM(run, multiplier, "" if switch is switches.NONE else switch.label, **model_options)
                try:
                    results = lm_eval.simple_evaluate(
                        model=lm, tasks=list(tasks), task_manager=manager, limit=limit, bootstrap_iters=0, log_samples=True
                    )
                except OSError as e:  # a dataset the Hub must give, offline or unreachable (requests' ConnectionError too)
                    raise UserError(
                        f"--tasks={','.join(tasks)}: a dataset could not be loaded ({type(e).__name__}: "
                        f"{(str(e).splitlines() or [''])[0]}); "
                        "the harness's own tasks download from the Hugging Face Hub on first use: run once with network "
                        "(HF_DATASETS_OFFLINE / HF_HUB_OFFLINE unset), or use --include_path's local tasks"
                    ) from None
                rows.append(
                    {
                        "run": pathlib.Path(run.workdir).name,
                        "step": run.step,
                        "variant": run.config.model.variant_name,
                        "switch": switch.label,
                        "multiplier": multiplier,
                        "context": lm.max_length,
                        "tasks": {task: metrics(results, task) for task in results["results"]},
                    }
                )
    return rows


def _cell(metric: dict) -> str:
    ci = metric["ci"]
    return f"{metric['value']:.4g}" + ("" if ci is None else f" [{ci[0]:.3g}, {ci[1]:.3g}]")


def markdown(rows: list[dict]) -> str:
    """The report's section: one line per run x switch x multiplier, one column per task and metric."""
    columns = sorted({(task, name) for row in rows for task, found in row["tasks"].items() for name in found})
    head = ["run", "step", "variant", "switch", "context"] + [f"{task} {name}" for task, name in columns]
    lines = [
        "## Downstream tasks (lm-evaluation-harness)",
        "",
        "Zero-shot unless stated; [95% bootstrap interval over documents] where the metric is a mean over documents.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        cells = [row["run"], str(row["step"]), row["variant"], row["switch"], f"{row['context']} ({row['multiplier']}x)"]
        cells += [_cell(row["tasks"][t][n]) if n in row["tasks"].get(t, {}) else "" for t, n in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write(out, rows: list[dict]) -> None:
    """OUT/harness.json and OUT/harness.md, each written atomically."""
    folder = storage.path(out)
    folder.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(folder / "harness.json", json.dumps({"runs": rows}, indent=1))
    storage.write_atomic(folder / "harness.md", markdown(rows))
