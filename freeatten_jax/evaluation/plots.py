"""PNG plots of the suite's results (matplotlib, no display needed).

Runs of one variant under one switch (e.g. several seeds) form one line: their mean. The loss band is the
95% interval of the mean over seeds, then windows (evaluation.stats); other bands span the runs' minimum
to maximum. One colour per variant, one line style per eval-time switch; a dotted
vertical line marks the training length. Each `draw_*` returns the figure so that tests can read it.
"""

import pathlib
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from freeatten_jax.evaluation import stats  # noqa: E402
from freeatten_jax.evaluation.results import RunResult, loss_unit  # noqa: E402

COLOURS = {
    "softmax": "tab:blue",
    "ssmax": "tab:orange",
    "lssa": "tab:green",
    "lssar": "tab:red",
    "sigmoid": "tab:purple",
    "relu": "tab:brown",
    "softmax_logn": "tab:cyan",
}
SPARE_COLOURS = ["tab:olive", "tab:pink", "tab:gray", "black", "gold", "navy", "lime", "maroon"]  # other variants'
STYLES = ["-", "--", ":", "-."]
MIN_LOSS_SPAN = 0.5  # nats: the y-axis of a loss plot never zooms in further (a 0.01-nat wobble stays flat)
LEGEND_TITLE = "colour: variant; line style: eval-time switch"


def groups(runs: list[RunResult]) -> dict[tuple[str, str], list[RunResult]]:
    """{(variant, switch): its runs}, in the order first seen."""
    out = {}
    for r in runs:
        out.setdefault(r.group, []).append(r)
    return out


def styles(runs: list[RunResult]):
    """(variant, switch) -> plot keywords: colour by variant, line style by switch."""
    switches = list(dict.fromkeys(r.switch for r in runs))
    switches = ["none", *[s for s in switches if s != "none"]]
    others = [v for v in dict.fromkeys(r.variant for r in runs) if v not in COLOURS]  # e.g. warm-started runs
    colours = {**COLOURS, **dict(zip(others, SPARE_COLOURS * len(others)))}

    def style(variant, switch):
        colour = colours[variant]
        return {"color": colour, "linestyle": STYLES[switches.index(switch) % len(STYLES)]}

    return style


def group_name(variant: str, switch: str, count: int) -> str:
    """How one (variant, switch) group of `count` runs is named in legends and summary tables."""
    return variant + ("" if switch == "none" else f" [{switch}]") + (f" ({count} runs)" if count > 1 else "")


def _nan_stats(values_RX, low_RX=None, high_RX=None):
    """Mean over runs, and the band: [min of lows, max of highs] (the values themselves if no interval given)."""
    values_RX = np.asarray(values_RX, float)
    with warnings.catch_warnings():  # lengths no run could score are NaN: gaps in the line
        warnings.simplefilter("ignore", RuntimeWarning)
        low_RX = values_RX if low_RX is None else np.asarray(low_RX, float)
        high_RX = values_RX if high_RX is None else np.asarray(high_RX, float)
        return np.nanmean(values_RX, 0), np.nanmin(low_RX, 0), np.nanmax(high_RX, 0)


def _line(ax, x, mean_X, low_X, high_X, style, label) -> None:
    ax.plot(x, mean_X, marker="o" if len(x) < 12 else None, markersize=3, label=label, **style)
    if not np.allclose(low_X, high_X, equal_nan=True):
        ax.fill_between(x, low_X, high_X, color=style["color"], alpha=0.15, linewidth=0)


def y_limits(low, high, min_span: float) -> tuple[float, float]:
    """The data's range (finite values), widened about its centre to at least `min_span`."""
    finite = np.concatenate([np.ravel(low), np.ravel(high)]).astype(float)
    finite = finite[np.isfinite(finite)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    pad = max((min_span - (hi - lo)) / 2, 0.05 * (hi - lo))
    return lo - pad, hi + pad


def _mark_train_len(ax, train_lens: set[int]) -> None:
    for n in sorted(train_lens):
        ax.axvline(n, color="grey", linestyle=":", linewidth=1, label=f"training length ({n})")


def _new(title: str, xlabel: str, ylabel: str):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return fig, ax


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title=LEGEND_TITLE, title_fontsize=7)


def draw_loss_vs_length(runs: list[RunResult]):
    """Mean loss by length per group, its 95% interval (seeds, then windows, resampled) as a band, the training
    length marked."""
    fig, ax = _new(
        "Loss vs length (same held-out span)", "evaluation length (tokens)", f"mean next-token loss ({loss_unit(runs)})"
    )
    style, lows, highs = styles(runs), [], []
    for (variant, switch), rs in groups(runs).items():
        x = [p.length for p in rs[0].lengths]
        summaries = [stats.mean_with_interval([r.lengths[i].per_window for r in rs]) for i in range(len(x))]
        mean_X, low_X, high_X = (np.asarray(v) for v in zip(*[(m["mean"], *m["ci"]) for m in summaries]))
        _line(ax, x, mean_X, low_X, high_X, style(variant, switch), group_name(variant, switch, len(rs)))
        lows.append(low_X), highs.append(high_X)
    _mark_train_len(ax, {r.train_len for r in runs})
    ax.set_xscale("log", base=2)
    if lows:
        ax.set_ylim(*y_limits(np.concatenate(lows), np.concatenate(highs), MIN_LOSS_SPAN))
    _legend(ax)
    return fig


def draw_per_position(runs: list[RunResult]):
    fig, ax = _new("Per-position loss at the longest length", "position", f"loss ({loss_unit(runs)}, moving average)")
    style, lows, highs = styles(runs), [], []
    for (variant, switch), rs in groups(runs).items():
        losses_RT = np.asarray([r.per_position for r in rs])
        width = max(1, losses_RT.shape[1] // 64)  # a moving average keeps the curves readable
        smooth_RT = np.stack([np.convolve(row, np.ones(width) / width, mode="valid") for row in losses_RT])
        mean_X, low_X, high_X = _nan_stats(smooth_RT)
        _line(
            ax,
            np.arange(smooth_RT.shape[1]) + width,
            mean_X,
            low_X,
            high_X,
            style(variant, switch),
            group_name(variant, switch, len(rs)),
        )
        lows.append(low_X), highs.append(high_X)
    _mark_train_len(ax, {r.train_len for r in runs})
    ax.set_xscale("log", base=2)
    if lows:
        ax.set_ylim(*y_limits(np.concatenate(lows), np.concatenate(highs), MIN_LOSS_SPAN))
    _legend(ax)
    return fig


def accuracy_grid(rs: list[RunResult], task: str) -> tuple[list[int], list[float], np.ndarray]:
    """(lengths, depths, accuracy [depth, length]) pooled over the runs' keys; NaN where nothing was scored."""
    cells = [c for r in rs for c in getattr(r, task)]
    lengths, depths = sorted({c.length for c in cells}), sorted({c.depth for c in cells})
    hits_DL, keys_DL = np.zeros((len(depths), len(lengths))), np.zeros((len(depths), len(lengths)))
    for c in cells:
        if c.accuracy is not None:
            d, n = depths.index(c.depth), lengths.index(c.length)
            hits_DL[d, n] += c.accuracy * c.keys
            keys_DL[d, n] += c.keys
    with np.errstate(invalid="ignore", divide="ignore"):
        return lengths, depths, np.where(keys_DL > 0, hits_DL / keys_DL, np.nan)


def draw_accuracy(runs: list[RunResult], task: str, title: str):
    """Greedy retrieval accuracy: a heatmap of depth x length per group when the grid has more than one cell,
    else one line per group (the mean over runs' depths and keys)."""
    grouped = groups(runs)
    grids = {key: accuracy_grid(rs, task) for key, rs in grouped.items()}
    if not any(len(lengths) * len(depths) > 1 for lengths, depths, _ in grids.values()):
        fig, ax = _new(title, "prompt length (tokens)", "greedy accuracy")
        style = styles(runs)
        for (variant, switch), (lengths, _, acc_DL) in grids.items():
            if lengths:
                _line(
                    ax,
                    lengths,
                    acc_DL[0],
                    acc_DL[0],
                    acc_DL[0],
                    style(variant, switch),
                    group_name(variant, switch, len(grouped[variant, switch])),
                )
        _mark_train_len(ax, {r.train_len for r in runs})
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.03, 1.03)
        _legend(ax)
        return fig
    names = {key: group_name(*key, len(rs)) for key, rs in grouped.items()}
    return draw_heatmaps({names[key]: grid for key, grid in grids.items()}, title, "needle depth", "greedy accuracy")


def draw_heatmaps(grids: dict[str, tuple[list[int], list[float], np.ndarray]], title: str, ylabel: str, label: str):
    """One panel per named grid (lengths, rows, values [row, length] in [0, 1]; NaN: nothing scored), each value
    written in its cell."""
    fig, axes = plt.subplots(1, len(grids), figsize=(3.2 * len(grids) + 1, 3.4), squeeze=False, constrained_layout=True)
    for ax, (name, (lengths, rows, values_DL)) in zip(axes[0], grids.items()):
        image = ax.imshow(values_DL, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        for (d, n), value in np.ndenumerate(values_DL):
            ax.text(
                n,
                d,
                "n/a" if np.isnan(value) else f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="grey" if np.isnan(value) else "white" if value < 0.5 else "black",
            )
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7, rotation=45)
        ax.set_yticks(range(len(rows)), [f"{d:g}" for d in rows], fontsize=7)
        ax.set(title=name, xlabel="prompt length (tokens)")
        ax.title.set_fontsize(8)
    axes[0, 0].set_ylabel(ylabel)
    fig.colorbar(image, ax=axes[0].tolist(), label=label)
    fig.suptitle(title, fontsize=9)
    return fig


def draw_mqar(runs: list[RunResult]):
    """MQAR per-query accuracy by length per group, one panel per placement of the pairs: the mean over runs, the runs'
    min to max as a band."""
    placements = list(dict.fromkeys(x.placement for r in runs for x in r.mqar))
    fig, axes = plt.subplots(1, len(placements), figsize=(5 * len(placements) + 3, 4.5), squeeze=False, sharey=True)
    style = styles(runs)
    for ax, placement in zip(axes[0], placements):
        ax.set(title=f"MQAR accuracy vs length, pairs at the {placement}", xlabel="sequence length (tokens)")
        for (variant, switch), rs in groups(runs).items():
            rows = [[x for x in r.mqar if x.placement == placement] for r in rs]
            _line(
                ax,
                [x.length for x in rows[0]],
                *_nan_stats([[x.accuracy for x in row] for row in rows]),
                style(variant, switch),
                group_name(variant, switch, len(rs)),
            )
        _mark_train_len(ax, {r.train_len for r in runs})
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.03, 1.03)
    axes[0, 0].set_ylabel("per-query accuracy")
    _legend(axes[0, -1])
    return fig


def draw_entropy_vs_n(runs: list[RunResult]):
    fig, ax = _new("Entropy vs N_i", "visible keys N_i", "attention entropy (nats, mean over layers and heads)")
    style = styles(runs)
    for (variant, switch), rs in groups(runs).items():
        entropy_RU = [np.asarray(r.attention.entropy).mean((0, 1)) for r in rs]
        _line(
            ax,
            rs[0].attention.n_from,
            *_nan_stats(entropy_RU),
            style(variant, switch),
            group_name(variant, switch, len(rs)),
        )
    n = np.asarray(runs[0].attention.n_from, float)
    ax.plot(n, np.log(n), color="grey", linestyle=":", label="uniform (log N)")
    ax.set_xscale("log", base=2)
    _legend(ax)
    return fig


def save(fig, path: pathlib.Path) -> str:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path.name


def write_all(out: pathlib.Path, runs: list[RunResult]) -> dict[str, str]:
    """Every plot of text runs, as {title: file name relative to out}."""
    return {
        "loss vs length": save(draw_loss_vs_length(runs), out / "loss_vs_length.png"),
        "per-position loss": save(draw_per_position(runs), out / "per_position.png"),
        "passkey (Landmark format)": save(
            draw_accuracy(runs, "passkey", "Passkey retrieval, Landmark format"), out / "passkey.png"
        ),
        "retrieval (training-mix format)": save(
            draw_accuracy(runs, "retrieval", "Retrieval, training-mix format"), out / "retrieval.png"
        ),
        "entropy vs N_i": save(draw_entropy_vs_n(runs), out / "entropy_vs_n.png"),
    }
