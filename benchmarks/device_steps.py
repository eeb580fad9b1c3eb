"""The steps of benchmarks/device_check.py; each prints one markdown table and exits 1 if a check fails.

    python benchmarks/device_steps.py {environment,correctness,unpacked,long,packed,sweep} [--tiny] [--seconds S]

Glossary: B batch (1), T length, H heads, D head dim, causal. Full sizes: the correctness check at T=2048, the
timed rows at T=8192 and 32768, H=16, D=128, bf16, against cuDNN softmax (jax.nn.dot_product_attention);
--tiny: T=64, H=2, D=16 on any machine (the CPU runs the kernels in Pallas interpret mode and the
baseline with implementation="xla"), to prove the script. Rows left when --seconds run out print as
"not reached". Imports only jax and numpy (and freeatten_jax.attention).
"""

import argparse
import functools
import os
import statistics
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from freeatten_jax import attention  # noqa: E402


class Sizes(NamedTuple):
    check_lengths: tuple[int, ...]  # T of the correctness check
    bench_t: int  # T of the timed rows
    long_t: int  # T of the long step's rows
    heads: int
    head_dim: int
    documents: int  # packed rows: this many equal documents in one sequence
    repeats: int
    check_variants: tuple[str, ...]  # the correctness check's
    bench_variants: tuple[str, ...]  # the timed rows' (packed: those of lssa and lssar among them)
    split_variants: tuple[str, ...]  # timed again with split_matmuls=True (the opt-in), beside their default
    packed_implementations: tuple[str, ...]  # packed softmax rows beside the baseline
    sweep_variants: tuple[str, ...]
    blocks: tuple[tuple[int, int, int], ...]  # (block_q, block_k, block_k_dkv) the sweep times
    baseline: str  # jax.nn.dot_product_attention's implementation


FULL = Sizes(
    (2048,),  # ~35 s a variant on the H200 (four fwd+bwd compiles): 8192 too did not fit the step's limit
    8192,
    32768,
    16,
    128,
    4,
    5,
    tuple(attention.VARIANTS),
    tuple(attention.VARIANTS),
    ("lssa", "lssar"),
    ("pallas",),
    ("softmax", "lssa", "lssar"),
    ((64, 64, 64), (64, 32, 32), (64, 64, 32), (128, 64, 64)),  # the fastest two on H200 and H100, and the next two
    "cudnn",
)
TINY = Sizes(
    (64,),
    64,
    128,
    2,
    16,
    2,
    1,
    ("softmax", "lssar"),
    ("softmax",),
    ("lssar",),
    ("pallas",),
    ("softmax",),
    ((16, 16, 16), (32, 32, 16)),
    "xla",
)
BF16_ULP = 2.0**-8  # one bf16 rounding: the packed check's tolerance is twice it
RATIO = 2.0  # FlashAttention's precision contract: the kernels' bf16 error at most this times the bf16 reference's


def _inputs(t: int, sizes: Sizes, seed: int = 0):
    """q, k, v and an output cotangent g, [1, T, H, D] bf16."""
    keys = jax.random.split(jax.random.key(seed), 4)
    return tuple(jax.random.normal(key, (1, t, sizes.heads, sizes.head_dim), jnp.bfloat16) for key in keys)


def _value_and_grads(attend):
    """jit of (q, k, v, g) -> (out, dq, dk, dv) of `attend` (the vjp of cotangent g)."""

    def run(q, k, v, g):
        out, vjp = jax.vjp(attend, q, k, v)
        return (out, *vjp(g.astype(out.dtype)))

    return jax.jit(run)


def _seconds(fn, args, repeats: int) -> float:
    """Median seconds of `repeats` calls after a warm-up (which also compiles), blocking on the results."""
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _relative_error(x, reference) -> float:
    x, reference = np.asarray(x, np.float32), np.asarray(reference, np.float32)
    return float(np.max(np.abs(x - reference)) / max(np.max(np.abs(reference)), 1e-30))


class Clock:
    """The step's time left: a row starts only while some remains."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> bool:
        return time.monotonic() < self.end


def _not_reached(cells: int) -> str:
    return "| " + " | ".join(["not reached"] + [""] * (cells - 1)) + " |"


def environment(sizes: Sizes, clock: Clock) -> bool:
    device = jax.devices()[0]
    print("| jax | backend | device | devices | baseline |\n|---|---|---|---|---|")
    print(f"| {jax.__version__} | {jax.default_backend()} | {device.device_kind} | {jax.device_count()} | {sizes.baseline} |")
    return True


def correctness(sizes: Sizes, clock: Clock) -> bool:
    """Per variant and length: the kernels' bfloat16 error (default blocks) over the reference's own bfloat16 error,
    for the output and dq, dk, dv, both against the float32 reference on the same inputs; by default and with
    split_matmuls=True (the opt-in), and cuDNN's (the baseline's) error beside softmax's. ok: every default ratio
    <= RATIO (FlashAttention's contract)."""
    print(
        f"H={sizes.heads}, D={sizes.head_dim}, bf16, causal, default blocks; error = max |x - ref| / max |ref| against "
        f"the float32 reference, for out, dq, dk, dv; ratio = pallas error / the bf16 reference's; ok: ratio <= {RATIO}\n"
    )
    print("| variant | T | ratios (out, dq, dk, dv) | split_matmuls ratios | bf16 reference errors | baseline errors | ok |")
    print("|---|---|---|---|---|---|---|")
    passed = True
    for t in sizes.check_lengths:
        q, k, v, g = _inputs(t, sizes)
        f32 = [x.astype(jnp.float32) for x in (q, k, v, g)]
        for variant in sizes.check_variants:
            if not clock.left():
                print(_not_reached(7))
                passed = False
                continue
            attend = functools.partial(functools.partial, attention.attend, variant=variant)  # attend(**options): a call
            calls = {
                "reference": attend(implementation="reference"),
                "pallas": attend(implementation="pallas"),
                "split": attend(implementation="pallas", split_matmuls=True),
            }
            calls |= {"baseline": _baseline(sizes)} if variant == "softmax" else {}
            exact = _value_and_grads(calls["reference"])(*f32)
            errors = {
                name: np.array([_relative_error(x, y) for x, y in zip(_value_and_grads(fn)(q, k, v, g), exact)])
                for name, fn in calls.items()
            }
            ratios = {name: errors[name] / errors["reference"] for name in ("pallas", "split")}
            ok = bool(np.all(ratios["pallas"] <= RATIO))
            passed &= ok
            cells = [
                _numbers(ratios["pallas"], "{:.2f}"),
                _numbers(ratios["split"], "{:.2f}"),
                _numbers(errors["reference"], "{:.1e}"),
                _numbers(errors["baseline"], "{:.1e}") if "baseline" in errors else "",
            ]
            print(f"| {variant} | {t} | {' | '.join(cells)} | {'ok' if ok else 'FAIL'} |", flush=True)
    return passed


def _numbers(values, spec: str) -> str:
    return ", ".join(spec.format(x) for x in values)


def _baseline(sizes: Sizes):
    """jax.nn.dot_product_attention (causal) with the sizes' implementation: the softmax the kernels stand beside."""
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=sizes.baseline)


def _timed_rows(rows, args, base_label: str, repeats: int, clock: Clock, flops: float) -> dict:
    """Prints `label | fwd ms | fwd+bwd ms | x base | TFLOP/s` for (label, attend) rows, the first the baseline."""
    print(f"| row | fwd ms | fwd+bwd ms | fwd+bwd x {base_label} | fwd+bwd TFLOP/s |\n|---|---|---|---|---|")
    times = {}
    for label, attend in rows:
        if not clock.left():
            print(_not_reached(5))
            continue
        forward = jax.jit(attend)
        try:
            fwd, both = _seconds(forward, args[:3], repeats), _seconds(_value_and_grads(attend), args, repeats)
        except Exception as error:  # a kernel that does not compile for this device: its row says why
            print(f"| {label} | error: {str(error).splitlines()[0][:150]} | | | |", flush=True)
            continue
        times[label] = both
        base = times[rows[0][0]]
        print(f"| {label} | {fwd * 1e3:.4g} | {both * 1e3:.4g} | {base / both:.3g} | {flops / both / 1e12:.3g} |", flush=True)
    return times


def _fwd_bwd_flops(t: int, sizes: Sizes, documents: int = 1) -> float:
    """FlashAttention's count: causal forward 2·B·H·T²·D, forward+backward 3.5x that (per document when packed)."""
    return 3.5 * 2 * sizes.heads * (t // documents) ** 2 * documents * sizes.head_dim


def _kernel_rows(variants, split_variants, **options) -> list:
    """(label, attend) rows of the Pallas kernels: each variant by default (split_matmuls=None: the variant's own
    default), then split_variants with split_matmuls=True."""
    rows = []
    for variant, split in [(v, None) for v in variants] + [(v, True) for v in split_variants]:
        label = f"{variant}, pallas{', split_matmuls' * bool(split)}{''.join(f', {k}={x}' for k, x in options.items())}"
        rows.append(
            (
                label,
                lambda q, k, v, variant=variant, split=split: attention.attend(
                    q, k, v, variant=variant, implementation="pallas", split_matmuls=split, **options
                ),
            )
        )
    return rows


def unpacked(sizes: Sizes, clock: Clock) -> bool:
    """Each variant's Pallas kernels (default blocks) beside the baseline softmax (cuDNN on a GPU), and the split
    matmuls (the opt-in) of split_variants."""
    args = _inputs(sizes.bench_t, sizes, seed=1)
    print(
        f"T={sizes.bench_t}, H={sizes.heads}, D={sizes.head_dim}, bf16, causal, one sequence; median of {sizes.repeats}; "
        "TFLOP/s in FlashAttention's causal count (the same for every row)\n"
    )
    rows = [(f"softmax, {sizes.baseline}", _baseline(sizes))] + _kernel_rows(sizes.bench_variants, sizes.split_variants)
    _timed_rows(rows, args, sizes.baseline, sizes.repeats, clock, _fwd_bwd_flops(sizes.bench_t, sizes))
    return True


def long(sizes: Sizes, clock: Clock) -> bool:
    """At T = long_t: softmax, LSSA and LSSAR kernels beside the baseline, with both dK/dV key blocks (the key
    block's default and 32)."""
    args = _inputs(sizes.long_t, sizes, seed=4)
    print(f"T={sizes.long_t}, H={sizes.heads}, D={sizes.head_dim}, bf16, causal, one sequence; median of {sizes.repeats}\n")
    variants = [v for v in ("softmax", "lssa", "lssar") if v in sizes.bench_variants]
    rows = [(f"softmax, {sizes.baseline}", _baseline(sizes))] + _kernel_rows(variants, ())
    rows += _kernel_rows(variants, (), block_k_dkv=min(32, sizes.long_t // 4))
    _timed_rows(rows, args, sizes.baseline, sizes.repeats, clock, _fwd_bwd_flops(sizes.long_t, sizes))
    return True


def packed(sizes: Sizes, clock: Clock) -> bool:
    """Softmax over equal packed documents (segment ids) against the baseline given the documents as a batch:
    the same attention, the least work a packed kernel can do; `pallas out err` checks the values."""
    t, n = sizes.bench_t, sizes.documents
    args = _inputs(t, sizes, seed=2)
    segments = jnp.arange(t) * n // t
    print(f"T={t} as {n} documents of {t // n}, H={sizes.heads}, D={sizes.head_dim}, bf16, causal within each document\n")

    def as_batch(x):
        return x.reshape(n, t // n, *x.shape[2:])

    def base(q, k, v):
        out = jax.nn.dot_product_attention(as_batch(q), as_batch(k), as_batch(v), is_causal=True, implementation=sizes.baseline)
        return out.reshape(q.shape)

    def packed_attend(implementation, variant="softmax"):
        return lambda q, k, v: attention.attend(q, k, v, variant=variant, implementation=implementation, q_segment_ids=segments)

    rows = [(f"softmax, {sizes.baseline}, documents as a batch", base)]
    rows += [
        (f"softmax, {implementation}, packed", packed_attend(implementation)) for implementation in sizes.packed_implementations
    ]
    rows += [
        (f"{variant}, pallas, packed", packed_attend("pallas", variant))
        for variant in ("lssa", "lssar")
        if variant in sizes.bench_variants
    ]
    _timed_rows(rows, args, "the batched baseline", sizes.repeats, clock, _fwd_bwd_flops(t, sizes, n))
    if not clock.left():
        print("\npallas out err: not reached")
        return False
    error = _relative_error(jax.jit(packed_attend("pallas"))(*args[:3]), jax.jit(base)(*args[:3]))
    print(f"\npallas out err (packed softmax against the batched baseline, max |x - base| / max |base|): {error:.2e}")
    return error <= 2 * BF16_ULP


def sweep(sizes: Sizes, clock: Clock) -> bool:
    """Pallas fwd+bwd time per (block_q, block_k, block_k_dkv) (the first two serve the three kernels, the last is
    the dK/dV kernel's key block), and the fastest per variant: the GPU block table."""
    args = _inputs(sizes.bench_t, sizes, seed=3)
    print(f"T={sizes.bench_t}, H={sizes.heads}, D={sizes.head_dim}, bf16, causal; median of {sizes.repeats}\n")
    print("| variant | block_q | block_k | block_k_dkv | fwd+bwd ms |\n|---|---|---|---|---|")
    fastest = {}  # variant -> (seconds, blocks)
    for variant in sizes.sweep_variants:
        for blocks in sizes.blocks:
            if not clock.left():
                print(_not_reached(5))
                continue
            attend = lambda q, k, v, blocks=blocks, variant=variant: attention.attend(
                q,
                k,
                v,
                variant=variant,
                implementation="pallas",  # noqa: E731
                block_q=blocks[0],
                block_k=blocks[1],
                block_k_dkv=blocks[2],
            )
            try:
                seconds = _seconds(_value_and_grads(attend), args, sizes.repeats)
            except Exception as error:  # e.g. shared memory exceeded: the row says so
                print(f"| {variant} | {' | '.join(map(str, blocks))} | error: {str(error).splitlines()[0][:150]} |", flush=True)
                continue
            print(f"| {variant} | {' | '.join(map(str, blocks))} | {seconds * 1e3:.4g} |", flush=True)
            fastest[variant] = min(fastest.get(variant, (seconds, blocks)), (seconds, blocks))
    print(
        "\nGPU_BLOCKS = "
        + repr({variant: blocks for variant, (_, blocks) in fastest.items()})
        + "  # fastest fwd+bwd (block_q, block_k, block_k_dkv)"
    )
    return True


STEPS = {
    "environment": environment,
    "correctness": correctness,
    "unpacked": unpacked,
    "long": long,
    "packed": packed,
    "sweep": sweep,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=list(STEPS))
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on any machine (CPU: interpret mode)")
    parser.add_argument("--seconds", type=float, default=600.0, help="start no row after this many seconds")
    args = parser.parse_args(argv)
    return 0 if STEPS[args.step](TINY if args.tiny else FULL, Clock(args.seconds)) else 1


if __name__ == "__main__":
    sys.exit(main())
