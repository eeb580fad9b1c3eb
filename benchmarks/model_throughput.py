"""Forward+backward tokens/s of a model preset, softmax vs every variant, in one run.

Usage: python benchmarks/model_throughput.py [--size tiny] [--batch 8] [--steps 5] [--implementation reference]
Prints the parameter count and one row per variant: median step time, tokens/s, ratio to softmax.
"""
import argparse
import math
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from configs.model_presets import model_config
from freeatten_jax import attention
from freeatten_jax.model import Transformer


def _loss(model, tokens_BT):
    logits_BTV = model(tokens_BT[:, :-1])
    return -jnp.take_along_axis(jax.nn.log_softmax(logits_BTV), tokens_BT[:, 1:, None], axis=-1).mean()


def compiled_step(cfg, batch: int):
    """A zero-argument function running one jitted forward+backward step (compiled and warmed up)."""
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    grad_fn = nnx.jit(nnx.value_and_grad(_loss))  # NNX transforms: remat and dropout streams are NNX state
    tokens_BT = jax.random.randint(jax.random.key(0), (batch, cfg.max_len + 1), 0, cfg.vocab_size)
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
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--implementation", default="reference", choices=list(attention.IMPLEMENTATIONS))
    args = parser.parse_args()
    cfg = model_config(args.size)
    cfg.implementation = args.implementation
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    tokens = args.batch * cfg.max_len
    print(f"{args.size}: {params:,} parameters; batch {args.batch} x {cfg.max_len} tokens; "
          f"{args.implementation}; {jax.devices()[0].platform} x{jax.device_count()}")
    steps = {}
    for variant in attention.VARIANTS:
        cfg.attention = variant
        steps[variant] = compiled_step(cfg, args.batch)
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
