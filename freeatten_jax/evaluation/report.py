"""Writes the suite's results: results.json, CSV files and report.md (tables and the plots)."""

import csv
import pathlib

import numpy as np

from freeatten_jax.evaluation import mqar_report, paired, plots, results, ruler_report
from freeatten_jax.evaluation.results import RetrievalCell, RunResult


def _write_csv(path: pathlib.Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def n_bins(n_from) -> list[str]:
    """The entropy tables' column headings: the bin of visible keys [n, 2n) each averages over (N=1, N=2-3, N=4-7...)."""
    return [f"N={n}" if n == 1 else f"N={n}-{2 * n - 1}" for n in n_from]


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3f}"


def _mean(cells: list[RetrievalCell], key: str) -> float | None:
    values = [getattr(c, key) for c in cells if getattr(c, key) is not None]
    return float(np.mean(values)) if values else None


def _rank_header(candidates: int) -> str:
    """The rank column's header: a rank means little without the number of candidates and chance's rank."""
    return f"mean rank of true key among {candidates} (chance {(candidates + 1) / 2:g})"


def retrieval_table(runs: list[RunResult], task: str, candidates: int) -> str:
    """Accuracy by length and mean key rank per run, then why the cells that could not be scored were not."""
    lengths = sorted({c.length for r in runs for c in getattr(r, task)})
    table = _md_table(
        ["run", *[str(n) for n in lengths], _rank_header(candidates)],
        [
            [
                r.label,
                *[_fmt(_mean([c for c in getattr(r, task) if c.length == n], "accuracy")) for n in lengths],
                _fmt(_mean(getattr(r, task), "mean_key_rank")),
            ]
            for r in runs
        ],
    )
    reasons = sorted({(c.length, c.reason) for r in runs for c in getattr(r, task) if c.reason})
    lines = [f"- length {n}: {reason}" for n, reason in reasons]
    return table + ("\n\nNot scored (n/a):\n" + "\n".join(lines) if lines else "")


def _envelope(rs: list[RunResult], multiplier: int, key: str) -> str:
    """Mean over runs at one multiplier with [the lowest low, the highest high] of the runs' 95% intervals (for one
    run: its mean and interval), or n/a."""
    xs = [x for r in rs for x in r.lengths if x.multiplier == multiplier]
    if not xs:
        return "n/a"
    return (
        f"{_fmt(float(np.mean([getattr(x, key) for x in xs])))} "
        f"[{_fmt(min(getattr(x, f'{key}_ci')[0] for x in xs))}, {_fmt(max(getattr(x, f'{key}_ci')[1] for x in xs))}]"
    )


def _pooled_accuracy(rs: list[RunResult], task: str, length: int) -> str:
    """Prompts retrieved / prompts scored at one length, over runs, depths and keys, or n/a."""
    cells = [c for r in rs for c in getattr(r, task) if c.length == length and c.accuracy is not None]
    scored = sum(c.keys for c in cells)
    return f"{round(sum(c.accuracy * c.keys for c in cells))}/{scored}" if scored else "n/a"


def _pooled_rank(rs: list[RunResult], task: str) -> str:
    """Mean rank of the true key over every scored prompt of the runs, or n/a."""
    cells = [c for r in rs for c in getattr(r, task) if c.mean_key_rank is not None]
    scored = sum(c.keys for c in cells)
    return _fmt(sum(c.mean_key_rank * c.keys for c in cells) / scored) if scored else "n/a"


def grouped_tables(runs: list[RunResult], multipliers, candidates: int) -> str:
    """Runs of one variant under one switch (e.g. seeds) as one row: loss and retrieval by length, attention entropy by
    visible keys and the learned SSMax s."""
    groups = plots.groups(runs)
    names = {key: plots.group_name(*key, len(rs)) for key, rs in groups.items()}
    lengths = [m * runs[0].train_len for m in multipliers] if runs else []
    loss = lambda key: _md_table(
        ["variant", *[f"{m}x" for m in multipliers]],
        [[names[g], *[_envelope(rs, m, key) for m in multipliers]] for g, rs in groups.items()],
    )
    retrieval = _md_table(
        ["variant", "task", *[str(n) for n in lengths], _rank_header(candidates)],
        [
            [names[g], task, *[_pooled_accuracy(rs, task, n) for n in lengths], _pooled_rank(rs, task)]
            for g, rs in groups.items()
            for task in ("passkey", "retrieval")
        ],
    )
    n_from = runs[0].attention.n_from if runs else []
    entropy = _md_table(
        ["variant", *n_bins(n_from)],
        [[names[g], *[_fmt(float(np.mean(column))) for column in zip(*map(_entropy_by_n, rs))]] for g, rs in groups.items()],
    )
    s_by_layer = {g: np.mean([r.ssmax_s for r in rs], axis=(0, 2)) for g, rs in groups.items() if rs[0].ssmax_s is not None}
    learned_s = _md_table(
        ["variant", *[f"layer {i}" for i in range(len(next(iter(s_by_layer.values()), [])))]],
        [[names[g], *map(_fmt, s_L)] for g, s_L in s_by_layer.items()],
    )
    return (
        f"Loss over all positions ({results.loss_unit(runs)}): mean over runs [lowest low, highest high of the runs' 95% "
        "intervals]\n\n"
        + loss("loss")
        + "\n\nLoss over the last training-length positions of each window (same format)\n\n"
        + loss("loss_last_train_len")
        + "\n\nRetrieval: prompts retrieved (greedy) / prompts scored by length, pooled over runs, depths and keys; "
        + "the key's rank is of its likelihood among the candidate keys (1: the most likely), not of what is generated\n\n"
        + retrieval
        + "\n\nAttention entropy (nats) by visible keys N_i at the longest length: mean over runs, layers and heads\n\n"
        + entropy
        + ("\n\nLearned SSMax s, mean over runs and heads, per layer\n\n" + learned_s if s_by_layer else "")
    )


def _entropy_by_n(r: RunResult) -> list[float]:
    """A run's attention entropy for rows that see at least each `n_from` keys, mean over layers and heads."""
    entropy_LHU = np.asarray(r.attention.entropy)
    return [float(np.mean(entropy_LHU[:, :, u])) for u in range(entropy_LHU.shape[2])]


def write_csvs(out: pathlib.Path, runs: list[RunResult]) -> None:
    _write_csv(
        out / "loss_vs_length.csv",
        [
            "run",
            "checkpoint",
            "step",
            "variant",
            "switch",
            "length",
            "multiplier",
            "loss",
            "loss_ci_low",
            "loss_ci_high",
            "loss_last_train_len",
            "loss_last_train_len_ci_low",
            "loss_last_train_len_ci_high",
            "windows",
            "tokens_scored",
        ],
        [
            [
                r.label,
                r.workdir,
                r.step,
                r.variant,
                r.switch,
                x.length,
                x.multiplier,
                x.loss,
                *x.loss_ci,
                x.loss_last_train_len,
                *x.loss_last_train_len_ci,
                x.windows,
                x.tokens_scored,
            ]
            for r in runs
            for x in r.lengths
        ],
    )
    _write_csv(
        out / "per_position.csv",
        ["run", "position", "loss"],
        [[r.label, i, v] for r in runs for i, v in enumerate(r.per_position)],
    )
    for task in ("passkey", "retrieval"):
        _write_csv(
            out / f"{task}.csv",
            ["run", "length", "depth", "accuracy", "mean_key_loglik", "mean_key_rank", "keys", "not_scored_because"],
            [
                [
                    r.label,
                    c.length,
                    c.depth,
                    c.accuracy,
                    c.mean_key_loglik,
                    c.mean_key_rank,
                    c.keys,
                    c.reason,
                ]
                for r in runs
                for c in getattr(r, task)
            ],
        )
    _write_csv(
        out / "attention.csv",
        ["run", "layer", "head", "n_from", "entropy", "max_weight"],
        [
            [r.label, layer, head, n, ent[head][u], mx[head][u]]
            for r in runs
            for layer, (ent, mx) in enumerate(zip(r.attention.entropy, r.attention.max_weight))
            for head in range(len(ent))
            for u, n in enumerate(r.attention.n_from)
        ],
    )
    _write_csv(
        out / "needle_mass.csv",
        ["run", "layer", "head", "mass"],
        [[r.label, layer, head, m] for r in runs for layer, row in enumerate(r.needle_mass) for head, m in enumerate(row)],
    )
    ssmax = [r for r in runs if r.ssmax_s is not None]
    _write_csv(
        out / "ssmax_s.csv",
        ["run", "layer", "head", "s"],
        [[r.label, layer, head, s] for r in ssmax for layer, row in enumerate(r.ssmax_s) for head, s in enumerate(row)],
    )


def comparability_warnings(runs: list[RunResult]) -> list[str]:
    """One line per way the compared runs differ that the tables do not control for: the checkpoint's
    training step, or the training length."""
    lines = []
    for key, what in (("step", "checkpoint steps"), ("train_len", "training lengths")):
        values = sorted({getattr(r, key) for r in runs})
        if len(values) > 1:
            named = "; ".join(f"{v}: {', '.join(sorted({r.name for r in runs if getattr(r, key) == v}))}" for v in values)
            lines.append(
                f"Warning: the runs compared have different {what} ({named}); their differences are not only the variant's."
            )
    return lines


def markdown(runs: list[RunResult], settings: dict, figures: dict[str, str]) -> str:
    multipliers = settings["multipliers"]
    mult_header = [f"{m}x" for m in multipliers]
    by_mult = lambda r, key: [_envelope([r], m, key) for m in multipliers]  # one run: its mean and interval
    checkpoints = _md_table(
        ["run", "checkpoint", "step", "variant", "switch", "train length", "RoPE theta"],
        [[r.label, r.workdir, r.step, r.variant, r.switch, r.train_len, f"{r.rope_theta:g}"] for r in runs],
    )
    windows = ", ".join(f"{x.length}: {x.windows} windows, {x.tokens_scored} tokens" for x in runs[0].lengths) if runs else ""
    spans = ", ".join(sorted({f"{r.span_tokens}" for r in runs}))
    n_from = runs[0].attention.n_from if runs else []
    entropy = _md_table(["run", *n_bins(n_from)], [[r.label, *map(_fmt, _entropy_by_n(r))] for r in runs])
    parts = [
        "# Length-extrapolation report",
        *comparability_warnings(runs),
        "## Checkpoints\n\n" + checkpoints,
        "## Summary by variant and switch\n\n" + grouped_tables(runs, multipliers, settings["passkey_candidates"]),
        *[part for part in [paired.markdown(runs, multipliers)] if part],
        f"## Loss vs length (mean next-token loss, {results.loss_unit(runs)}, [95% bootstrap interval over windows])\n\n"
        f"Every length scores the same held-out span: the first {spans} validation tokens, cut into non-overlapping "
        f"windows of each length ({windows}).\n\n"
        + _md_table(["run", *mult_header], [[r.label, *by_mult(r, "loss")] for r in runs]),
        "## Loss over the last training-length positions of each window\n\n"
        + _md_table(["run", *mult_header], [[r.label, *by_mult(r, "loss_last_train_len")] for r in runs]),
        f"## Passkey retrieval, Landmark format (greedy: first integer generated equals the key; by prompt length, mean over "
        f"depths {settings['passkey_depths']} and {settings['passkey_keys']} keys; rank among {settings['passkey_candidates']} "
        f"candidate keys)\n\n" + retrieval_table(runs, "passkey", settings["passkey_candidates"]),
        '## Retrieval in the training mix\'s format (data.retrieval: filler, "The pass key is NNNNN. ", then '
        '"\\nThe pass key is"; windows of length + 1 tokens as in training; same scoring)\n\n'
        + retrieval_table(runs, "retrieval", settings["passkey_candidates"]),
        "## Attention entropy (nats, mean over layers and heads) by visible keys N_i at the longest length\n\n" + entropy,
        "## Attention mass of the final query on the needle (mean over layers, heads and prompts)\n\n"
        + _md_table(["run", "mass"], [[r.label, _fmt(float(np.mean(r.needle_mass))) if r.needle_mass else "n/a"] for r in runs]),
    ]
    ssmax = [r for r in runs if r.ssmax_s is not None]
    if ssmax:
        parts.append(
            "## Learned SSMax s (mean over heads, per layer)\n\n"
            + _md_table(
                ["run", *[f"layer {i}" for i in range(len(ssmax[0].ssmax_s))]],
                [[r.label, *[_fmt(float(np.mean(row))) for row in r.ssmax_s]] for r in ssmax],
            )
        )
    parts += ruler_report.markdown(runs, settings)
    parts.append("## Plots\n\n" + "\n".join(f"![{name}]({path})" for name, path in figures.items()))
    return "\n\n".join(parts) + "\n"


def write(out: pathlib.Path, runs: list[RunResult], settings: dict) -> None:
    """All outputs of the suite into `out`: results.json, then report.md with its CSVs and plots for text runs (the
    RULER-style section's too), and mqar.md, mqar.csv and mqar.png for MQAR runs."""
    out.mkdir(parents=True, exist_ok=True)
    results.write(out / "results.json", runs, settings)
    text = [r for r in runs if r.mqar is None]
    if text:
        write_csvs(out, text)
        figures = {**plots.write_all(out, text), **ruler_report.write(out, text)}
        (out / "report.md").write_text(markdown(text, settings, figures))
    if mqar := [r for r in runs if r.mqar is not None]:
        _write_csv(out / "mqar.csv", *mqar_report.csv_rows(mqar))
        mqar_report.write_queries(out / "mqar_queries.csv.gz", mqar)
        figure = plots.save(plots.draw_mqar(mqar), out / "mqar.png")
        (out / "mqar.md").write_text(
            "# MQAR extrapolation report\n\n"
            + "\n\n".join(comparability_warnings(mqar) + [mqar_report.markdown(mqar), f"![MQAR accuracy vs length]({figure})"])
            + "\n"
        )
