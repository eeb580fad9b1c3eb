"""Attention benchmark: every variant and implementation against jax.nn.dot_product_attention softmax.

Glossary: B batch, T length, H heads, D head dim. Causal, B=1, H=12, D=64 (--heads, --head-dim);
float32 on CPU (baseline implementation="xla"), bfloat16 on GPU (baseline "cudnn"). Times are medians
of --repeats runs after a warm-up, blocking on results; memory is the compiled temp bytes
(memory_analysis()). "x base" is the baseline's time over this row's time (above 1: faster than the
baseline softmax). --packed N adds softmax rows over N packed documents (segment ids) per
implementation. With --peak-tflops (default on GPU: 989, the H200/H100 bf16 dense datasheet peak)
each row also shows its fwd+bwd FLOP rate (FA convention: causal 2·B·H·T²·D forward, 3.5x that
forward+backward) as a fraction of that peak, and the issue-10 targets are printed as ratios.

  python benchmarks/attention.py                       # full table, written to benchmarks/RESULTS.md
  python benchmarks/attention.py --quick               # T=2048, blockwise only, printed only
  python benchmarks/attention.py --lengths 2048 --variants lssa,lssar --block-q 256 --block-k 256
  python benchmarks/attention.py --rss-check           # LSSAR fwd+bwd at T=16384: peak resident memory
  python benchmarks/attention.py --lengths 8192 --heads 16 --head-dim 128 --variants lssa,lssar \
      --implementations pallas,blockwise --packed 4      # the issue-10 device table (GPU)
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

HEADS, HEAD_DIM = 12, 64  # defaults of --heads, --head-dim
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


def _inputs(t: int, dtype, heads: int = HEADS, head_dim: int = HEAD_DIM):
    keys = jax.random.split(jax.random.key(t), 4)
    return tuple(jax.random.normal(key, (1, t, heads, head_dim), dtype) for key in keys)


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


def floor_seconds(variant: str, t: int, rates, heads: int = HEADS, head_dim: int = HEAD_DIM) -> float:
    """Arithmetic floor of causal forward+backward: matmuls at peak plus the transcendentals, no overhead."""
    visible = heads * t * (t + 1) / 2
    seconds = MATMULS.get(variant, 7) * 2 * head_dim * visible / rates["matmul"]
    return seconds + sum(count * visible / rates[op] for op, count in TRANSCENDENTALS[variant].items())


def _rows_to_run(args):
    """(label, variant, implementation, extra attend options) for every non-baseline row."""
    rows = []
    for variant in args.variants:
        for implementation in args.implementations:
            rows.append((variant, variant, implementation, {}))
    if args.packed:
        for implementation in args.implementations:
            rows.append((f"softmax, {args.packed} docs", "softmax", implementation, {"packed": args.packed}))
    return rows


def _attend_fn(variant: str, implementation: str, extra, args, t: int):
    options = dict(block_q=args.block_q, block_k=args.block_k) if implementation == "blockwise" else {}
    if extra.get("packed"):
        options["q_segment_ids"] = jnp.arange(t) * extra["packed"] // t  # equal documents, packed
    return lambda q, k, v: attention.attend(q, k, v, variant=variant, implementation=implementation, **options)  # noqa: E731


def fwd_bwd_flops(t: int, heads: int, head_dim: int) -> float:
    """FlashAttention's convention: causal forward 2·B·H·T²·D (half of 4·B·H·T²·D), backward 2.5x forward."""
    return 3.5 * 2 * heads * t * t * head_dim


def run_table(args) -> list[str]:
    gpu = jax.default_backend() == "gpu"
    dtype, baseline_impl = (jnp.bfloat16, "cudnn") if gpu else (jnp.float32, "xla")
    rates = machine_rates(args.repeats)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else None
    header = "| T | variant | implementation | fwd ms | fwd x base | fwd+bwd ms | fwd+bwd x base | temp MB (fwd+bwd) | temp / base | floor ms | % of floor |"  # noqa: E501
    header += " fwd+bwd % of peak |" if peak else ""
    lines = ["Rates for the floor: " + ", ".join(f"{k} {v / 1e9:.3g} G/s" for k, v in rates.items()), "", header]
    lines.append("|" + "---|" * (header.count("|") - 1))
    print("\n".join(lines), flush=True)
    times = {}  # (t, label, implementation) -> fwd+bwd seconds
    for t in args.lengths:
        q, k, v, g = _inputs(t, dtype, args.heads, args.head_dim)
        flops = fwd_bwd_flops(t, args.heads, args.head_dim)
        base = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=baseline_impl)  # noqa: E731
        base_fwd, base_fb = _compiled_pair(base, q, k, v, g)
        base_times = (_time(base_fwd, (q, k, v), args.repeats), _time(base_fb, (q, k, v, g), args.repeats))
        base_temp = base_fb.memory_analysis().temp_size_in_bytes
        times[t, "softmax", "baseline"] = base_times[1]
        row = ("softmax", f"{baseline_impl} (baseline)", *base_times, base_temp, None)
        lines.append(_row(t, row, base_times, base_temp, peak and flops / peak))
        print(lines[-1], flush=True)
        for label, variant, implementation, extra in _rows_to_run(args):
            fwd, fb = _compiled_pair(_attend_fn(variant, implementation, extra, args, t), q, k, v, g)
            temp = fb.memory_analysis().temp_size_in_bytes
            row_times = (None, None)
            if temp <= args.max_temp_gb * 2**30:
                row_times = (_time(fwd, (q, k, v), args.repeats), _time(fb, (q, k, v, g), args.repeats))
            times[t, label, implementation] = row_times[1]
            floor = floor_seconds(variant, t, rates, args.heads, args.head_dim)
            lines.append(_row(t, (label, implementation, *row_times, temp, floor), base_times, base_temp, peak and flops / peak))
            print(lines[-1], flush=True)
    if peak:
        targets = target_lines(times, args, baseline_impl)
        lines += ["", *targets]
        print("\n".join(targets), flush=True)
    return lines


# The kernels' targets: fwd+bwd throughput relative to the baseline softmax, cuDNN on a GPU (label, implementation, ratio).
TARGETS = [("lssa", "pallas", 0.8), ("lssar", "pallas", 0.6), ("softmax, 4 docs", "pallas", 0.7)]


def target_lines(times, args, baseline_impl: str) -> list[str]:
    """The targets as measured ratios against the baseline (cuDNN on GPU); a missing row: not measured."""
    lines = ["| T | target | measured | goal | met |", "|---|---|---|---|---|"]
    for t in args.lengths:
        base = times[t, "softmax", "baseline"]
        for label, implementation, goal in TARGETS:
            got = times.get((t, label, implementation))
            ratio = None if got is None else base / got
            lines.append(_target_row(t, f"{implementation} {label} / {baseline_impl} softmax", ratio, goal))
        for (t_row, label, implementation), got in times.items():
            blockwise = times.get((t_row, label, "blockwise"))
            if t_row == t and implementation == "pallas" and got and blockwise:
                lines.append(_target_row(t, f"pallas {label} / blockwise {label}", blockwise / got, 2.0))
    return lines


def _target_row(t, name, ratio, goal) -> str:
    measured, met = ("not measured", "") if ratio is None else (f"{ratio:.2f}x", "yes" if ratio >= goal else "no")
    return f"| {t} | {name} | {measured} | >= {goal}x | {met} |"


def _row(t, row, base_times, base_temp, peak_seconds=None) -> str:
    variant, implementation, fwd, fb, temp, floor = row
    ms = lambda s: "skipped" if s is None else f"{s * 1e3:.0f}"  # noqa: E731
    ratio = lambda base, s: "" if s is None else f"{base / s:.2f}"  # noqa: E731
    floor_cells = ["", ""] if floor is None or fb is None else [f"{floor * 1e3:.0f}", f"{100 * floor / fb:.0f}%"]
    cells = [str(t), variant, implementation, ms(fwd), ratio(base_times[0], fwd), ms(fb), ratio(base_times[1], fb)]
    cells += [f"{temp / 2**20:.0f}", f"{temp / base_temp:.3f}", *floor_cells]
    if peak_seconds is not None:
        cells.append("" if fb is None else f"{100 * peak_seconds / fb:.1f}%")
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
    attend = lambda q, k, v: attention.attend(
        q, k, v, variant="lssar", implementation="blockwise", block_q=block_q, block_k=block_k
    )  # noqa: E731
    _, fb = _compiled_pair(attend, q, k, v, g)
    start = time.perf_counter()
    grads = jax.block_until_ready(fb(q, k, v, g))
    finite = all(bool(jnp.all(jnp.isfinite(x))) for x in grads)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"RSS {peak_mb:.0f} MB, {seconds:.1f} s, temp {fb.memory_analysis().temp_size_in_bytes / 2**20:.0f} MB, finite {finite}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(attention.VARIANTS))
    parser.add_argument(
        "--implementations",
        type=lambda s: s.split(","),
        default=None,
        help="default: reference,blockwise (and pallas off the CPU, where it would run interpreted)",
    )
    parser.add_argument("--heads", type=int, default=HEADS)
    parser.add_argument("--head-dim", type=int, default=HEAD_DIM)
    parser.add_argument("--packed", type=int, default=0, help="also softmax over this many packed documents")
    parser.add_argument("--peak-tflops", type=float, default=None, help="default on GPU: 989 (H200 bf16 dense)")
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
    args.implementations = args.implementations or ["reference", "blockwise"] + ["pallas"] * (jax.default_backend() != "cpu")
    args.peak_tflops = args.peak_tflops or (989.0 if gpu else None)
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
