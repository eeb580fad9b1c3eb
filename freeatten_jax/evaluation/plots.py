"""PNG plots of the suite's results (matplotlib, no display needed)."""
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _save(fig, path: pathlib.Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def loss_vs_length(out, runs, label) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        ax.plot([x["length"] for x in r["lengths"]], [x["loss"] for x in r["lengths"]], marker="o", label=label(r))
    ax.set_xscale("log", base=2)
    ax.set(xlabel="evaluation length (tokens)", ylabel="mean next-token loss (nats)", title="Loss vs length")
    ax.legend(fontsize=7)
    return _save(fig, out / "loss_vs_length.png")


def per_position(out, runs, label) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        losses = np.asarray(r["per_position"])
        width = max(1, len(losses) // 64)  # a moving average keeps the curves readable
        smooth = np.convolve(losses, np.ones(width) / width, mode="valid")
        ax.plot(np.arange(len(smooth)) + width, smooth, label=label(r))
    train_len = runs[0]["train_len"]
    ax.axvline(train_len, color="grey", linestyle=":", label="training length")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="position", ylabel="loss (nats, moving average)", title="Per-position loss at the longest length")
    ax.legend(fontsize=7)
    return _save(fig, out / "per_position.png")


def passkey(out, runs, label) -> str:
    fig, axes = plt.subplots(1, len(runs), figsize=(3.2 * len(runs), 3.2), squeeze=False)
    for ax, r in zip(axes[0], runs):
        if not r["passkey"]:
            ax.text(0.5, 0.5, "no passkey cells", ha="center", va="center")
            ax.set_title(label(r), fontsize=7)
            continue
        lengths = sorted({c["length"] for c in r["passkey"]})
        depths = sorted({c["depth"] for c in r["passkey"]})
        grid = np.full((len(depths), len(lengths)), np.nan)
        for c in r["passkey"]:
            grid[depths.index(c["depth"]), lengths.index(c["length"])] = np.nan if c["accuracy"] is None else c["accuracy"]
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths], fontsize=7)
        ax.set(xlabel="length", ylabel="depth")
        ax.set_title(label(r), fontsize=7)
    return _save(fig, out / "passkey.png")


def entropy_vs_n(out, runs, label) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        n_from = r["attention"]["n_from"]
        ax.plot(n_from, np.asarray(r["attention"]["entropy"]).mean((0, 1)), marker=".", label=label(r))
    if runs:
        n = np.asarray(runs[0]["attention"]["n_from"], float)
        ax.plot(n, np.log(n), color="grey", linestyle=":", label="uniform (log N)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="visible keys N_i", ylabel="attention entropy (nats, mean over layers and heads)", title="Entropy vs N_i")
    ax.legend(fontsize=7)
    return _save(fig, out / "entropy_vs_n.png")


def write_all(out: pathlib.Path, runs: list[dict], label) -> dict[str, str]:
    """Every plot, as {title: file name relative to out}."""
    return {
        "loss vs length": loss_vs_length(out, runs, label),
        "per-position loss": per_position(out, runs, label),
        "passkey": passkey(out, runs, label),
        "entropy vs N_i": entropy_vs_n(out, runs, label),
    }
