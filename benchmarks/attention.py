"""Attention benchmark: every variant and implementation against jax.nn.dot_product_attention softmax.

Glossary: B batch, T length, H heads, D head dim. Causal, B=1, H=12, D=64; float32 on CPU (baseline
implementation="xla"), bfloat16 on GPU (baseline "cudnn"). Times are medians of --repeats runs after
a warm-up, blocking on results; memory is the compiled temp bytes (memory_analysis()). "x base" is
the baseline's time over this row's time (above 1: faster than the baseline softmax).

  python benchmarks/attention.py                       # full table, written to benchmarks/RESULTS.md
  python benchmarks/attention.py --quick               # T=2048, blockwise only, printed only
  python benchmarks/attention.py --lengths 2048 --variants lssa,lssar --block-q 256 --block-k 256
  python benchmarks/attention.py --rss-check           # LSSAR fwd+bwd at T=16384: peak resident memory
"""
import argparse
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from freeatten_jax import attention  # noqa: E402

HEADS, HEAD_DIM = 12, 64
# Element-wise transcendental work per visible score, forward + backward (backward recomputes scores).
TRANSCENDENTALS = {
    "softmax": {"exp": 2},
    "ssmax": {"exp": 2},
    "lssa": {"softplus": 2, "sigmoid": 1},
    "lssar": {"softplus": 3, "sigmoid": 1},
    "sigmoid": {"sigmoid": 2},
    "relu": {},
}
MATMULS = {"lssar": 8}  # [T, D] x [D, T]-sized matmuls per visible score, forward + backward; others 7


def _time(fn, args, repeats: int, summary=statistics.median) -> float:
    jax.block_until_ready(fn(*args))  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - start)
    return summary(samples)


def _inputs(t: int, dtype):
    keys = jax.random.split(jax.random.key(t), 4)
    return tuple(jax.random.normal(key, (1, t, HEADS, HEAD_DIM), dtype) for key in keys)


def _compiled_pair(attend, q, k, v, g):
    """Compiled forward and forward+backward (vjp of a random cotangent) for one attention function."""
    forward = jax.jit(attend).lower(q, k, v).compile()

    def forward_backward(q, k, v, g):
        out, vjp = jax.vjp(attend, q, k, v)
        return vjp(g)

    return forward, jax.jit(forward_backward).lower(q, k, v, g).compile()


def machine_rates(repeats: int) -> dict[str, float]:
    """This machine's float32 matmul FLOP/s and element-wise rates (elements/s): best of `repeats`."""
    a = jax.random.normal(jax.random.key(0), (2048, 2048))
    rates = {"matmul": 2 * 2048**3 / _time(jax.jit(lambda a: a @ a), (a,), repeats, min)}
    x = jax.random.normal(jax.random.key(1), (12, 256, 256)) * 4
    for name, fn in [("exp", jnp.exp), ("softplus", jax.nn.softplus), ("sigmoid", jax.nn.sigmoid)]:
        rates[name] = x.size / _time(jax.jit(fn), (x,), repeats, min)
    return rates


def floor_seconds(variant: str, t: int, rates) -> float:
    """Arithmetic floor of causal forward+backward: matmuls at peak plus the transcendentals, no overhead."""
    visible = HEADS * t * (t + 1) / 2
    seconds = MATMULS.get(variant, 7) * 2 * HEAD_DIM * visible / rates["matmul"]
    return seconds + sum(count * visible / rates[op] for op, count in TRANSCENDENTALS[variant].items())


def run_table(args) -> list[str]:
    gpu = jax.default_backend() == "gpu"
    dtype, baseline_impl = (jnp.bfloat16, "cudnn") if gpu else (jnp.float32, "xla")
    rates = machine_rates(args.repeats)
    header = "| T | variant | implementation | fwd ms | fwd x base | fwd+bwd ms | fwd+bwd x base | temp MB (fwd+bwd) | temp / base | floor ms | % of floor |"
    lines = ["Rates for the floor: " + ", ".join(f"{k} {v / 1e9:.3g} G/s" for k, v in rates.items()), "", header]
    lines.append("|" + "---|" * (header.count("|") - 1))
    print("\n".join(lines), flush=True)
    for t in args.lengths:
        q, k, v, g = _inputs(t, dtype)
        base = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=baseline_impl)  # noqa: E731
        base_fwd, base_fb = _compiled_pair(base, q, k, v, g)
        base_times = (_time(base_fwd, (q, k, v), args.repeats), _time(base_fb, (q, k, v, g), args.repeats))
        base_temp = base_fb.memory_analysis().temp_size_in_bytes
        lines.append(_row(t, ("softmax", f"{baseline_impl} (baseline)", *base_times, base_temp, None), base_times, base_temp))
        print(lines[-1], flush=True)
        for variant in args.variants:
            for implementation in args.implementations:
                options = dict(block_q=args.block_q, block_k=args.block_k) if implementation == "blockwise" else {}
                attend = lambda q, k, v: attention.attend(q, k, v, variant=variant, implementation=implementation, **options)  # noqa: E731
                fwd, fb = _compiled_pair(attend, q, k, v, g)
                temp = fb.memory_analysis().temp_size_in_bytes
                times = (None, None)
                if temp <= args.max_temp_gb * 2**30:
                    times = (_time(fwd, (q, k, v), args.repeats), _time(fb, (q, k, v, g), args.repeats))
                lines.append(_row(t, (variant, implementation, *times, temp, floor_seconds(variant, t, rates)), base_times, base_temp))
                print(lines[-1], flush=True)
    return lines


def _row(t, row, base_times, base_temp) -> str:
    variant, implementation, fwd, fb, temp, floor = row
    ms = lambda s: "skipped" if s is None else f"{s * 1e3:.0f}"  # noqa: E731
    ratio = lambda base, s: "" if s is None else f"{base / s:.2f}"  # noqa: E731
    floor_cells = ["", ""] if floor is None or fb is None else [f"{floor * 1e3:.0f}", f"{100 * floor / fb:.0f}%"]
    cells = [str(t), variant, implementation, ms(fwd), ratio(base_times[0], fwd), ms(fb), ratio(base_times[1], fb)]
    cells += [f"{temp / 2**20:.0f}", f"{temp / base_temp:.3f}", *floor_cells]
    return "| " + " | ".join(cells) + " |"


def machine_description() -> str:
    with open("/proc/meminfo") as f:
        memory_gb = int(f.readline().split()[1]) / 2**20
    device = jax.devices()[0]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {memory_gb:.0f} GB; "
        f"JAX {jax.__version__} on {device.platform} ({device.device_kind}); load average at start {load}"
    )


def rss_child(t: int, block_q: int, block_k: int) -> None:
    """Forward+backward of blockwise LSSAR at length t in this process; prints peak resident MB and seconds."""
    q, k, v, g = _inputs(t, jnp.float32)
    attend = lambda q, k, v: attention.attend(q, k, v, variant="lssar", implementation="blockwise", block_q=block_q, block_k=block_k)  # noqa: E731
    _, fb = _compiled_pair(attend, q, k, v, g)
    start = time.perf_counter()
    grads = jax.block_until_ready(fb(q, k, v, g))
    finite = all(bool(jnp.all(jnp.isfinite(x))) for x in grads)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"RSS {peak_mb:.0f} MB, {seconds:.1f} s, temp {fb.memory_analysis().temp_size_in_bytes / 2**20:.0f} MB, finite {finite}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(attention.VARIANTS))
    parser.add_argument("--implementations", type=lambda s: s.split(","), default=["reference", "blockwise"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--block-q", type=int, default=None, help="blockwise query block (default: the platform's)")
    parser.add_argument("--block-k", type=int, default=None, help="blockwise key block (default: the platform's)")
    parser.add_argument("--max-temp-gb", type=float, default=8.0, help="skip runs whose compiled temp memory is larger")
    parser.add_argument("--quick", action="store_true", help="T=2048, blockwise only, nothing written")
    parser.add_argument("--rss-check", action="store_true", help="LSSAR fwd+bwd at --rss-length in a fresh process")
    parser.add_argument("--rss-length", type=int, default=16384)
    parser.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md"))
    args = parser.parse_args()
    if args.rss_child:
        return rss_child(args.rss_length, args.block_q, args.block_k)
    if args.rss_check:
        blocks = [f"--block-q={args.block_q}"] * bool(args.block_q) + [f"--block-k={args.block_k}"] * bool(args.block_k)
        command = [sys.executable, __file__, "--rss-child", f"--rss-length={args.rss_length}", *blocks]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        print(f"blockwise LSSAR fwd+bwd, T={args.rss_length}, H={HEADS}, D={HEAD_DIM}: {result.stdout.strip()}")
        return None
    gpu = jax.default_backend() == "gpu"
    if args.quick:
        args.lengths, args.implementations = args.lengths or [2048], ["blockwise"]
    args.lengths = args.lengths or ([512, 1024, 2048, 4096, 8192, 16384] if gpu else [512, 1024, 2048, 4096])
    machine = machine_description()
    print(machine, flush=True)
    lines = run_table(args)
    if not args.quick:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        command = "python benchmarks/attention.py " + " ".join(sys.argv[1:])
        text = f"\n## {stamp}: `{command.strip()}`\n\nMachine: {machine}\n\n" + "\n".join(lines) + "\n"
        with open(args.output, "a") as f:
            f.write(text)
    return None


if __name__ == "__main__":
    main()
