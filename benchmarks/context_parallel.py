"""Context-parallel attention benchmark: per-device compiled temp memory and time of forward+backward.

Glossary: B batch, T length, H heads, K kv heads, D head dim, n the context axis size. Causal, B=1,
H=4, D=32, K=--kv-heads, float32, over 8 forced host devices. n = 1 is the single-device blockwise
path (the baseline); n = 2, 4, 8 is context_parallel_attend over a mesh of n devices, per --strategies.
Memory is `compiled.memory_analysis().temp_size_in_bytes` of the forward+backward program (per device:
the SPMD program is one device's); time is the median of --repeats runs after a warm-up. Host devices
share the machine's cores, so time ratios are not speedups; memory ratios are what to read.

  python benchmarks/context_parallel.py                          # T = 8K..64K; times up to --time-up-to
  python benchmarks/context_parallel.py --lengths 16384 --variants lssa --kv-heads 1 --strategies ring,gather --time-up-to 0
"""

import argparse
import datetime
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import attention as attention_benchmark  # noqa: E402  (benchmarks/attention.py: its timing loop)

from freeatten_jax import attention  # noqa: E402

HEADS, HEAD_DIM = 4, 32
CONTEXT_SIZES = (2, 4, 8)


def _shapes(t: int, kv_heads: int):
    """q, k, v, cotangent shapes: [1, t, H, D] and [1, t, K, D]."""
    return [(1, t, heads, HEAD_DIM) for heads in (HEADS, kv_heads, kv_heads, HEADS)]


def _compiled(attend, shapes, sharding):
    """The compiled forward+backward (vjp of a cotangent w.r.t. q, k, v)."""

    def forward_backward(q, k, v, g):
        _, vjp = jax.vjp(attend, q, k, v)
        return vjp(g)

    structs = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding) for shape in shapes]
    return jax.jit(forward_backward).lower(*structs).compile()


def _seconds(compiled, shapes, sharding, repeats: int) -> float:
    keys = jax.random.split(jax.random.key(shapes[0][1]), 4)
    args = [jax.device_put(jax.random.normal(key, shape), sharding) for key, shape in zip(keys, shapes)]
    return attention_benchmark._time(compiled, args, repeats)


def _configurations(variant: str, strategies):
    """(name, context size, attend, sharding of the inputs): the blockwise baseline first."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    yield "1 (blockwise)", 1, lambda q, k, v: attention.attend(q, k, v, variant=variant, implementation="blockwise"), device
    for size in CONTEXT_SIZES:
        mesh = jax.make_mesh((size,), ("context",), devices=jax.devices()[:size], axis_types=(jax.sharding.AxisType.Auto,))
        for strategy in strategies:
            options = dict(mesh=mesh, axis_name="context", variant=variant, strategy=strategy)
            attend = lambda q, k, v, options=options: attention.context_parallel_attend(q, k, v, **options)  # noqa: E731
            yield f"{size} ({strategy})", size, attend, NamedSharding(mesh, P(None, "context"))


def run_table(args) -> list[str]:
    header = "| T | variant | kv heads | context n | temp MB / device | temp / n=1 | n x temp / n=1 | fwd+bwd ms | time / n=1 |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    print("\n".join(lines), flush=True)
    for t in args.lengths:
        for variant in args.variants:
            base = None
            shapes = _shapes(t, args.kv_heads)
            for name, size, attend, sharding in _configurations(variant, args.strategies):
                compiled = _compiled(attend, shapes, sharding)
                temp = compiled.memory_analysis().temp_size_in_bytes
                seconds = _seconds(compiled, shapes, sharding, args.repeats) if t <= args.time_up_to else None
                base = base or (temp, seconds)
                time_cells = ["unmeasured", ""] if seconds is None else [f"{seconds * 1e3:.0f}", f"{seconds / base[1]:.2f}"]
                cells = [
                    str(t),
                    variant,
                    str(args.kv_heads),
                    name,
                    f"{temp / 2**20:.1f}",
                    f"{temp / base[0]:.3f}",
                    f"{size * temp / base[0]:.2f}",
                    *time_cells,
                ]
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[8192, 16384, 32768, 65536])
    parser.add_argument("--variants", type=lambda s: s.split(","), default=["lssar", "softmax"])
    parser.add_argument("--kv-heads", type=int, default=HEADS, help=f"key/value heads (H = {HEADS})")
    parser.add_argument("--strategies", type=lambda s: s.split(","), default=["ring"], help="ring, gather or both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-up-to", type=int, default=8192, help="time only lengths up to this (memory for all)")
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS_context_parallel.md")
    parser.add_argument("--output", default=results)
    args = parser.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    machine = f"{os.cpu_count()} cores; JAX {jax.__version__}, {len(jax.devices())} host devices; load average at start {load}"
    print(machine, flush=True)
    lines = run_table(args)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    command = "python benchmarks/context_parallel.py " + " ".join(sys.argv[1:])
    with open(args.output, "a") as f:
        f.write(f"\n## {stamp}: `{command.strip()}`\n\nMachine: {machine}\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
