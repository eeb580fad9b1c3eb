"""Context-parallel attention benchmark: per-device compiled temp memory and time of forward+backward.

Glossary: B batch, T length, H heads, D head dim, n the context axis size. Causal, B=1, H=4, D=32,
float32, over 8 forced host devices. n = 1 is the single-device blockwise path (the baseline); n = 2,
4, 8 is context_parallel_attend over a mesh of n devices. Memory is
`compiled.memory_analysis().temp_size_in_bytes` of the forward+backward program (per device: the
SPMD program is one device's); time is the median of --repeats runs after a warm-up. Host devices
share the machine's cores, so time ratios are not speedups; memory ratios are what to read.

  python benchmarks/context_parallel.py                          # T = 8K..64K; times up to --time-up-to
  python benchmarks/context_parallel.py --lengths 8192 --variants lssa --time-up-to 0
"""
import argparse
import datetime
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from freeatten_jax import attention  # noqa: E402

HEADS, HEAD_DIM = 4, 32
CONTEXT_SIZES = (2, 4, 8)


def _compiled(attend, t: int, sharding):
    """The compiled forward+backward (vjp of a cotangent w.r.t. q, k, v) for [1, t, H, D] inputs."""

    def forward_backward(q, k, v, g):
        _, vjp = jax.vjp(attend, q, k, v)
        return vjp(g)

    shape = jax.ShapeDtypeStruct((1, t, HEADS, HEAD_DIM), jnp.float32, sharding=sharding)
    return jax.jit(forward_backward).lower(shape, shape, shape, shape).compile()


def _seconds(compiled, t: int, sharding, repeats: int) -> float:
    keys = jax.random.split(jax.random.key(t), 4)
    args = [jax.device_put(jax.random.normal(key, (1, t, HEADS, HEAD_DIM)), sharding) for key in keys]
    jax.block_until_ready(compiled(*args))  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _configurations(variant: str):
    """(context size, attend, sharding of the inputs): the blockwise baseline first."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    yield 1, lambda q, k, v: attention.attend(q, k, v, variant=variant, implementation="blockwise"), device
    for size in CONTEXT_SIZES:
        mesh = jax.make_mesh((size,), ("context",), devices=jax.devices()[:size], axis_types=(jax.sharding.AxisType.Auto,))
        attend = lambda q, k, v, mesh=mesh: attention.context_parallel_attend(q, k, v, mesh=mesh, axis_name="context", variant=variant)  # noqa: E731
        yield size, attend, NamedSharding(mesh, P(None, "context"))


def run_table(args) -> list[str]:
    header = "| T | variant | context | temp MB / device | temp / n=1 | n x temp / n=1 | fwd+bwd ms | time / n=1 |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    print("\n".join(lines), flush=True)
    for t in args.lengths:
        for variant in args.variants:
            base = None
            for size, attend, sharding in _configurations(variant):
                compiled = _compiled(attend, t, sharding)
                temp = compiled.memory_analysis().temp_size_in_bytes
                seconds = _seconds(compiled, t, sharding, args.repeats) if t <= args.time_up_to else None
                base = base or (temp, seconds)
                time_cells = ["unmeasured", ""] if seconds is None else [f"{seconds * 1e3:.0f}", f"{seconds / base[1]:.2f}"]
                cells = [str(t), variant, "1 (blockwise)" if size == 1 else str(size), f"{temp / 2**20:.1f}",
                         f"{temp / base[0]:.3f}", f"{size * temp / base[0]:.2f}", *time_cells]
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[8192, 16384, 32768, 65536])
    parser.add_argument("--variants", type=lambda s: s.split(","), default=["lssar", "softmax"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-up-to", type=int, default=8192, help="time only lengths up to this (memory for all)")
    parser.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS_context_parallel.md"))
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
