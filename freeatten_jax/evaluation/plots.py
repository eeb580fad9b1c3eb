"""PNG plots of the suite's results (matplotlib, no display needed).

Runs of one variant under one switch (e.g. several seeds) form one line: their mean, with a band from
their minimum to their maximum. One colour per variant, one line style per switch.
"""
import pathlib
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLOURS = {"softmax": "tab:blue", "ssmax": "tab:orange", "lssa": "tab:green", "lssar": "tab:red", "sigmoid": "tab:purple",
           "relu": "tab:brown"}
STYLES = ["-", "--", ":", "-."]


def groups(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """{(variant, switch): its runs}, in the order first seen."""
    out = {}
    for r in runs:
        out.setdefault((r["variant"], r["switch"]), []).append(r)
    return out


def _style(runs: list[dict]):
    """(variant, switch) -> plot keywords: colour by variant, line style by switch."""
    switches = list(dict.fromkeys(r["switch"] for r in runs))
    switches = ["none", *[s for s in switches if s != "none"]]
    def style(variant, switch):
        colour = COLOURS.get(variant, "tab:gray")
        return {"color": colour, "linestyle": STYLES[switches.index(switch) % len(STYLES)]}
    return style


def group_name(variant: str, switch: str, count: int) -> str:
    """How one (variant, switch) group of `count` runs is named in legends and summary tables."""
    return variant + ("" if switch == "none" else f" [{switch}]") + (f" ({count} runs)" if count > 1 else "")


def _band(ax, x, values_RX, style, label) -> None:
    """Mean line over runs with a min-max band (no band for one run)."""
    values_RX = np.asarray(values_RX, float)
    with warnings.catch_warnings():  # lengths no run could score are NaN: gaps in the line
        warnings.simplefilter("ignore", RuntimeWarning)
        mean_X, low_X, high_X = np.nanmean(values_RX, 0), np.nanmin(values_RX, 0), np.nanmax(values_RX, 0)
    ax.plot(x, mean_X, marker="o" if len(x) < 12 else None, markersize=3, label=label, **style)
    if len(values_RX) > 1:
        ax.fill_between(x, low_X, high_X, color=style["color"], alpha=0.15, linewidth=0)


def _finish(fig, ax, path: pathlib.Path) -> str:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path.name


def loss_vs_length(out, runs) -> str:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    style = _style(runs)
    for (variant, switch), rs in groups(runs).items():
        x = [p["length"] for p in rs[0]["lengths"]]
        _band(ax, x, [[p["loss"] for p in r["lengths"]] for r in rs], style(variant, switch), group_name(variant, switch, len(rs)))
    ax.set_xscale("log", base=2)
    ax.set(xlabel="evaluation length (tokens)", ylabel="mean next-token loss (nats)", title="Loss vs length (same held-out span)")
    return _finish(fig, ax, out / "loss_vs_length.png")


def per_position(out, runs) -> str:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    style = _style(runs)
    for (variant, switch), rs in groups(runs).items():
        losses_RT = np.asarray([r["per_position"] for r in rs])
        width = max(1, losses_RT.shape[1] // 64)  # a moving average keeps the curves readable
        smooth_RT = np.stack([np.convolve(row, np.ones(width) / width, mode="valid") for row in losses_RT])
        _band(ax, np.arange(smooth_RT.shape[1]) + width, smooth_RT, style(variant, switch), group_name(variant, switch, len(rs)))
    ax.axvline(runs[0]["train_len"], color="grey", linestyle=":", label="training length")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="position", ylabel="loss (nats, moving average)", title="Per-position loss at the longest length")
    return _finish(fig, ax, out / "per_position.png")


def accuracy_vs_length(out, runs, task: str, title: str) -> str:
    """Greedy retrieval accuracy (mean over depths and keys) by length; unscored lengths are gaps."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    style = _style(runs)
    for (variant, switch), rs in groups(runs).items():
        x = sorted({c["length"] for c in rs[0][task]})
        acc = lambda r, n: np.mean([np.nan if c["accuracy"] is None else c["accuracy"] for c in r[task] if c["length"] == n])
        if x:
            _band(ax, x, [[acc(r, n) for n in x] for r in rs], style(variant, switch), group_name(variant, switch, len(rs)))
    ax.set_xscale("log", base=2)
    ax.set(xlabel="prompt length (tokens)", ylabel="greedy accuracy", ylim=(-0.03, 1.03), title=title)
    return _finish(fig, ax, out / f"{task}.png")


def entropy_vs_n(out, runs) -> str:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    style = _style(runs)
    for (variant, switch), rs in groups(runs).items():
        entropy_RU = [np.asarray(r["attention"]["entropy"]).mean((0, 1)) for r in rs]
        _band(ax, rs[0]["attention"]["n_from"], entropy_RU, style(variant, switch), group_name(variant, switch, len(rs)))
    n = np.asarray(runs[0]["attention"]["n_from"], float)
    ax.plot(n, np.log(n), color="grey", linestyle=":", label="uniform (log N)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="visible keys N_i", ylabel="attention entropy (nats, mean over layers and heads)", title="Entropy vs N_i")
    return _finish(fig, ax, out / "entropy_vs_n.png")


def write_all(out: pathlib.Path, runs: list[dict]) -> dict[str, str]:
    """Every plot, as {title: file name relative to out}."""
    return {
        "loss vs length": loss_vs_length(out, runs),
        "per-position loss": per_position(out, runs),
        "passkey (Landmark format)": accuracy_vs_length(out, runs, "passkey", "Passkey retrieval, Landmark format"),
        "retrieval (training-mix format)": accuracy_vs_length(out, runs, "retrieval", "Retrieval, training-mix format"),
        "entropy vs N_i": entropy_vs_n(out, runs),
    }
