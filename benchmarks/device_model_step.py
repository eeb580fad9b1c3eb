"""A gpt2_small training step's tokens/s and MFU per attention variant, on one GPU in at most 4 minutes.

  python benchmarks/device_model_step.py          # GPU: gpt2_small, bf16, AdamW; T=1024 x 8 and 8192 x 1 sequences
  python benchmarks/device_model_step.py --tiny   # CPU: a one-layer tiny preset at T=64 x 2 and 128 x 1, to prove it

Rows: softmax, ssmax, lssa, lssar through implementation="auto" (on a GPU: cuDNN for softmax and ssmax; the
reference or the Pallas kernels for lssa and lssar by length) at each (T, batch). The step is the trainer's
(training/step.py): the model merged, nnx.value_and_grad of the mean next-token loss, global-norm clipping and
AdamW (b2 0.95, decay on matrices), the new state donated; the loss unchunked (training/loss.py's import of the data
package needs grain), its [B, T, V] float32 logits 1.6 GB at 8192 tokens.
Each row compiles and warms up first (not timed), then times steps while its own budget (ROW_SECONDS) lasts;
rows left print "not reached", and the process ends at LIMIT whatever runs (device_route's Budget and hard_limit).
FLOPs per token are the trainer's count (training/flops.py: 6 N + 6 L T E); MFU is against the device's dense bf16
peak (the H100's 989 TFLOP/s where the device is not listed). Writes $OUT/device_model_step.md when $OUT is set.
Imports only jax, flax, optax, the library (freeatten_jax.nn; attention.auto's rule, to name each row's path;
training/flops.py, which needs only nn.config) and device_route's helpers.

Glossary: B batch, L = T + 1 window tokens, T length, V vocabulary.
"""

import argparse
import os
import statistics
import sys
import time
from typing import NamedTuple

import jax
import optax
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_route import Budget, Report, hard_limit  # noqa: E402

from freeatten_jax import attention  # noqa: E402
from freeatten_jax.attention.auto import choose  # noqa: E402
from freeatten_jax.nn import Transformer, preset  # noqa: E402
from freeatten_jax.training import flops  # noqa: E402

VARIANTS = ("softmax", "ssmax", "lssa", "lssar")
ROW_SECONDS = 27  # 8 rows: 216 s
LIMIT = 240  # seconds: the whole process
TINY_SLACK = 4  # --tiny's budgets and limit are this many times the device's (loaded CPUs)
COLUMNS = (
    *("variant", "T x B", "attention (auto)", "compile s", "step ms", "steps", "tokens/s", "GFLOP/token", "TFLOP/s", "MFU"),
    "loss (first, last)",  # the same batch every step: the loss falls from log V
)
H100_PEAK = 989.0  # dense bf16 TFLOP/s, for a device flops.PEAK_TFLOPS does not list


class Sizes(NamedTuple):
    size: str  # the preset
    overrides: dict  # ModelConfig fields over the preset's
    shapes: tuple[tuple[int, int], ...]  # (T, batch) of each row group
    steps: int  # timed steps a row, median taken


FULL = Sizes("gpt2_small", {}, ((1024, 8), (8192, 1)), 10)
TINY = Sizes("tiny", {"num_layers": 1, "dtype": "bfloat16"}, ((64, 2), (128, 1)), 2)


def optimizer() -> optax.GradientTransformation:
    """The trainer's: clip at global norm 1, AdamW (gpt2_small's lr 6e-4, b1 0.9, b2 0.95, decay 0.1 on matrices)."""
    matrices = lambda params: jax.tree.map(lambda p: p.ndim > 1, params)
    return optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(6e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=matrices)
    )


def train_step(cfg, tx):
    """(jitted step(state, tokens_BL) -> (state, loss) with the state donated, the initial state)."""
    graphdef, params, rest = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)

    def loss_fn(model, tokens_BL):
        logits_BTV = model(tokens_BL[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits_BTV, tokens_BL[:, 1:]).mean()

    def step(state, tokens_BL):
        model = nnx.merge(graphdef, state["params"], state["rest"], copy=True)
        loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param))(model, tokens_BL)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "rest": nnx.state(model, nnx.Not(nnx.Param)), "opt_state": opt_state}, loss

    return jax.jit(step, donate_argnums=0), {"params": params, "rest": rest, "opt_state": tx.init(params)}


def attention_path(cfg, t: int, batch: int) -> str:
    """What implementation="auto" picks for this model's attention on this backend."""
    head_dim = cfg.d_model // cfg.num_heads
    q_BTHD = jax.ShapeDtypeStruct((batch, t, cfg.num_heads, head_dim), cfg.dtype)
    mask = attention.make_mask(batch, t, t, causal=True)
    choice = choose(q_BTHD, q_BTHD, variant=attention.get_variant(cfg.attention), mask=mask)
    return {"fused": "cuDNN" if jax.default_backend() == "gpu" else "fused"}.get(choice, choice)


def row(report: Report, budget: Budget, sizes: Sizes, variant: str, t: int, batch: int, remat: str, peak: float) -> None:
    """Compiles and warms up one step, then times steps while the budget lasts (one at least) and prints the row."""
    label = f"| {variant} | {t} x {batch} |"
    short = lambda text: report(f"{label} {text} |" + " |" * (len(COLUMNS) - 3))  # a row with no numbers
    if not budget.left():
        return short("not reached")
    cfg = preset(sizes.size, **sizes.overrides, attention=variant, max_len=t, remat=remat)
    tokens_BL = jax.random.randint(jax.random.key(t), (batch, t + 1), 0, cfg.vocab_size)
    start = time.perf_counter()
    try:
        step, state = train_step(cfg, optimizer())
        state, first_loss = step(state, tokens_BL)
        jax.block_until_ready(first_loss)
    except Exception as error:  # a step that does not compile or fit here: its row says why
        return short(f"error: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:150]}")
    compile_s, samples = time.perf_counter() - start, list[float]()
    while not samples or (len(samples) < sizes.steps and budget.left()):
        start = time.perf_counter()
        state, loss = step(state, tokens_BL)
        jax.block_until_ready(loss)
        samples.append(time.perf_counter() - start)
    seconds = statistics.median(samples)
    tokens_per_s = batch * t / seconds
    per_token = flops.train_flops_per_token(cfg, t)
    tflops = tokens_per_s * per_token / 1e12
    cells = [attention_path(cfg, t, batch), f"{compile_s:.1f}", f"{seconds * 1e3:.4g}", str(len(samples))]
    cells += [f"{tokens_per_s:.4g}", f"{per_token / 1e9:.4g}", f"{tflops:.4g}", f"{tflops / peak:.3g}"]
    cells.append(f"{float(first_loss):.3f}, {float(loss):.3f}")
    report(f"{label} {' | '.join(cells)} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on any machine")
    parser.add_argument("--remat", choices=("none", "dots", "full"), help="the blocks' rematerialisation; default the preset's")
    parser.add_argument("--budget_scale", type=float, default=1.0, help="every row's seconds times this (0: no row)")
    args = parser.parse_args(argv)
    sizes, slack = (TINY, TINY_SLACK) if args.tiny else (FULL, 1)
    out = os.environ.get("OUT")
    report = Report(os.path.join(out, "device_model_step.md") if out else None)
    hard_limit(LIMIT * slack, report)
    remat = args.remat or preset(sizes.size).remat
    kind = jax.devices()[0].device_kind
    peak = flops.peak_tflops(kind) or H100_PEAK
    report(
        f"# Model step (`python benchmarks/device_model_step.py {' '.join(sys.argv[1:] if argv is None else argv)}`)\n",
        f"{sizes.size} {sizes.overrides or ''}, bf16 compute, remat {remat}, AdamW; jax {jax.__version__} on {kind}; "
        f"MFU against {peak:g} TFLOP/s; compile s: the model built and its first step run (not timed); step ms: the median "
        "of the timed steps after it\n",
        "| " + " | ".join(COLUMNS) + " |",
        "|---" * len(COLUMNS) + "|",
    )
    for t, batch in sizes.shapes:
        for variant in VARIANTS:
            row(report, Budget(ROW_SECONDS * slack * args.budget_scale), sizes, variant, t, batch, remat, peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())
