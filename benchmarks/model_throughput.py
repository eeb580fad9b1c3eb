"""Forward+backward tokens/s of a model preset, softmax vs every variant, in one run.

Usage: python benchmarks/model_throughput.py [--size tiny] [--seq_len 256] [--batch 8] [--steps 5] [--implementation reference]
Prints the parameter count and one row per variant: median step time, tokens/s, ratio to softmax.
"""

import argparse
import math
import pathlib
import statistics
import sys
import time

import jax
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # the checkout's package, run from anywhere
from freeatten_jax import attention  # noqa: E402
from freeatten_jax.nn import Transformer, preset  # noqa: E402
from freeatten_jax.training.loss import next_token_losses  # noqa: E402


def _loss(model, tokens_BT):
    return next_token_losses(model, tokens_BT).mean()


def compiled_step(cfg, batch: int, seq_len: int):
    """A zero-argument function running one jitted forward+backward step (compiled and warmed up)."""
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    grad_fn = nnx.jit(nnx.value_and_grad(_loss))  # NNX transforms: remat and dropout streams are NNX state
    tokens_BT = jax.random.randint(jax.random.key(0), (batch, seq_len + 1), 0, cfg.vocab_size)
    step = lambda: jax.block_until_ready(grad_fn(model, tokens_BT))
    step()
    return step


def seconds(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--implementation", default="reference", choices=list(attention.IMPLEMENTATIONS))
    args = parser.parse_args()
    cfg = preset(args.size, implementation=args.implementation, max_len=args.seq_len)
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    tokens = args.batch * args.seq_len
    print(
        f"{args.size}: {params:,} parameters; batch {args.batch} x {args.seq_len} tokens; "
        f"{args.implementation}; {jax.devices()[0].platform} x{jax.device_count()}"
    )
    steps = {}
    for variant in attention.VARIANTS:
        steps[variant] = compiled_step(cfg.replace(attention=variant), args.batch, args.seq_len)
    times = {variant: [] for variant in steps}
    for _ in range(args.steps):  # interleaved rounds: load changes hit every variant alike
        for variant, step in steps.items():
            times[variant].append(seconds(step))
    print(f"{'variant':<8} {'step ms':>8} {'tokens/s':>9} {'vs softmax':>10}")
    baseline = statistics.median(times["softmax"])
    for variant, samples in times.items():
        median = statistics.median(samples)
        print(f"{variant:<8} {median * 1e3:8.1f} {tokens / median:9.0f} {baseline / median:10.2f}")


if __name__ == "__main__":
    main()
