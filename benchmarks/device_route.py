"""The Hopper route's deciding number: a Mosaic GPU LSSA forward against cuDNN softmax, in one process of at most 6 minutes.

  python benchmarks/device_route.py --probe DIR         # GPU: T=8192, B=1, H=16, D=128 and 64, causal
  python benchmarks/device_route.py --tiny [--probe DIR]  # CPU: interpret mode, tiny sizes, to prove the script

Rows: cuDNN softmax forward and fwd+bwd (bf16, the baseline); JAX's attention_mgpu forward (float16, the public
Mosaic GPU reference); the research note's scratch LSSA forward (DIR/lssa_mgpu.py, carried untracked for a device
run, never project code; "not carried" without it) in modes mufu, poly4, split4, poly (and mufu with Z summed from
the float32 weights, the F2F question); the project's LSSA Pallas kernels; then each compiled kernel's output error
against float32 at T=2048 (the hardware's approximate ex2/lg2, which interpret mode cannot see). Ratios are
cuDNN's time over the row's, both measured here; the route decision follows the note's rule (ROUTE_RULE).
Each step runs under its own budget (STEP_SECONDS: no row starts after it, rows left print "not reached") and
the process ends at LIMIT whatever runs. With $OUT set: the report goes to $OUT/device_route.md as it is printed and
Mosaic GPU's dumps (PTX, ptxas log, SASS) to $OUT/mosaic_dump. Imports only jax, numpy and freeatten_jax.attention.

Glossary: B batch (1), T length, H heads, D head dim; x_BTHD an array of that shape; fwd+bwd the vjp of a cotangent.
"""

import argparse
import functools
import importlib.util
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from freeatten_jax import attention  # noqa: E402

STEP_SECONDS = {"baseline": 40, "probe": 100, "mgpu": 40, "errors": 80, "pallas": 60}  # 320 s together
LIMIT = 360  # seconds: the whole process, killed there whatever runs
TINY_SLACK = 4  # --tiny's budgets and limit are this many times the device's (loaded CPUs)
PROBE_ROWS = (("mufu", True), ("poly4", True), ("split4", True), ("poly", True), ("mufu", False))  # (mode, round_z)
ROUTE_RULE = (0.75, 0.6)  # poly4 or split4 forward >= 0.75x cuDNN's: build the backward; below 0.6x: hand-tune first


class Sizes(NamedTuple):
    t: int  # the timed rows' length
    error_t: int  # the error rows' length
    heads: int
    head_dims: tuple[int, ...]  # the first decides the route and has the error rows
    repeats: int  # timed samples, median taken
    calls: int  # back-to-back calls a sample (the dispatch overlaps the previous call)
    baseline: str  # jax.nn.dot_product_attention's implementation


FULL = Sizes(8192, 2048, 16, (128, 64), 5, 10, "cudnn")
TINY = Sizes(128, 128, 1, (64,), 1, 1, "xla")


class Budget:
    """A step's own seconds: a row starts only while some are left."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> bool:
        return time.monotonic() < self.end


class Report:
    """Lines printed as they come and appended to a markdown file, which a kill at the limit keeps."""

    def __init__(self, path: str | None):
        self.path = path
        if path:
            open(path, "w").close()

    def __call__(self, *lines: str) -> None:
        text = "\n".join(lines)
        print(text, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(text + "\n")


def hard_limit(seconds: float, report: Report) -> None:
    """Ends the process with exit status 124 at `seconds` from now whatever runs, saying so in the report."""

    def stop():
        report(f"\nkilled at the {seconds:.0f} s limit: every row after this line was not reached")
        os._exit(124)

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()


def seconds_per_call(fn, args, budget: Budget, repeats: int, calls: int) -> float:
    """Median seconds a call of `repeats` samples of `calls` back-to-back calls, after a warm-up that compiles;
    samples stop when the budget runs out (one at least)."""
    jax.block_until_ready(fn(*args))
    samples: list[float] = []
    while not samples or (len(samples) < repeats and budget.left()):
        start = time.perf_counter()
        out = [fn(*args) for _ in range(calls)]
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def value_and_grads(fn):
    """jit of (q, k, v, g) -> (out, dq, dk, dv): fn and the vjp of cotangent g."""

    def run(q, k, v, g):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(g.astype(out.dtype)))

    return jax.jit(run)


@functools.cache
def inputs(t: int, heads: int, d: int, dtype: str):
    """q, k (unit rows: LSSA's inputs), v and a cotangent g, each [1, T, H, D] of `dtype`."""
    q, k, v, g = (jax.random.normal(key, (1, t, heads, d), jnp.float32) for key in jax.random.split(jax.random.key(d), 4))
    q, k = (x / jnp.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    return tuple(x.astype(dtype) for x in (q, k, v, g))


def lssa_scale(t: int, d: int) -> float:
    """The probe's fixed score scale: LSSA's temperature log(D) log(N_i) at its last row, N_i = T."""
    return math.log(d) * math.log(t)


def lssa_reference(q_BTHD, k_BTHD, v_BTHD, scale: float):
    """Causal softplus(scale q.k) weights over their row sum, in float32 on the inputs as given (no renormalising)."""
    q, k, v = (x.astype(jnp.float32) for x in (q_BTHD, k_BTHD, v_BTHD))
    t = q.shape[1]
    u_BHTS = jnp.where(jnp.tri(t, dtype=bool), jax.nn.softplus(scale * jnp.einsum("bthd,bshd->bhts", q, k)), 0.0)
    return jnp.einsum("bhts,bshd->bthd", u_BHTS / u_BHTS.sum(-1, keepdims=True), v)


def load_probe(folder: str | None):
    """(the lssa_mgpu module of `folder`, "") or (None, why its rows cannot run)."""
    path = os.path.join(folder or "", "lssa_mgpu.py")
    if not folder or not os.path.isfile(path):
        return None, "not carried"
    try:
        spec = importlib.util.spec_from_file_location("lssa_mgpu", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as error:  # a probe that does not import on this jax: its rows say why
        return None, f"error: {_first_line(error)}"
    return module, ""


def _first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:150]}"


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.4g}"


def _ratio(base: float | None, seconds: float | None) -> str:
    return "" if base is None or seconds is None else f"{base / seconds:.3g}"


class Run:
    """One run's sizes, report, probe and every timed row's (fwd, fwd+bwd) seconds by (label, D)."""

    def __init__(self, sizes: Sizes, report: Report, probe, probe_missing: str):
        self.sizes, self.report, self.probe, self.probe_missing = sizes, report, probe, probe_missing
        self.times: dict[tuple[str, int], tuple[float | None, float | None]] = {}
        self.base = f"softmax, {sizes.baseline}"
        self.on_gpu = jax.default_backend() == "gpu"

    def table_head(self) -> None:
        self.report(
            f"| row | D | fwd ms | fwd x {self.base} | fwd+bwd ms | fwd+bwd x {self.base} | fwd TFLOP/s |",
            "|---|---|---|---|---|---|---|",
        )

    def skipped(self, label: str, d: int, why: str) -> None:
        self.report(f"| {label} | {d} | {why} | | | | |")

    def timed(self, budget: Budget, label: str, d: int, forward, dtype: str = "bfloat16", backward: bool = False) -> None:
        """Times `forward` (and its fwd+bwd) at (T, D) and prints its row beside the baseline's."""
        if not budget.left():
            return self.skipped(label, d, "not reached")
        s = self.sizes
        args = inputs(s.t, s.heads, d, dtype)
        try:
            fwd = seconds_per_call(jax.jit(forward), args[:3], budget, s.repeats, s.calls)
            both = seconds_per_call(value_and_grads(forward), args, budget, s.repeats, s.calls) if backward else None
        except Exception as error:  # a kernel that does not compile or run here: its row says why
            return self.skipped(label, d, f"error: {_first_line(error)}")
        self.times[label, d] = fwd, both
        base_fwd, base_both = self.times.get((self.base, d), (None, None))
        tflops = 2 * s.heads * s.t**2 * d / fwd / 1e12  # FlashAttention's causal forward count, 4 B H T^2 D / 2
        cells = [_ms(fwd), _ratio(base_fwd, fwd), _ms(both), _ratio(base_both, both), f"{tflops:.3g}"]
        self.report(f"| {label} | {d} | {' | '.join(cells)} |")

    def fwd_ratio(self, label: str, d: int) -> float | None:
        fwd, base = self.times.get((label, d), (None,))[0], self.times.get((self.base, d), (None,))[0]
        return None if fwd is None or base is None else base / fwd


def _probe_label(mode: str, round_z: bool) -> str:
    return f"lssa probe, {mode}{'' if round_z else ', round_z=0'}"


def _probe_forward(run: Run, mode: str, round_z: bool, t: int, d: int):
    return functools.partial(
        run.probe.lssa_forward, scale=lssa_scale(t, d), mode=mode, causal=True, interpret=not run.on_gpu, round_z=round_z
    )


def _mgpu_forward(q, k, v):
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    config = attention_mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=True)
    return attention_mgpu.attention(q, k, v, config)


def _baseline_forward(run: Run):
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=run.sizes.baseline)


def _pallas_lssa(q, k, v):
    return attention.attend(q, k, v, variant="lssa", implementation="pallas")


MGPU_OFF_GPU = "needs a GPU (0.10.2's interpret mode lacks its run_state)"


def baseline(run: Run, budget: Budget) -> None:
    run.table_head()
    for d in run.sizes.head_dims:
        run.timed(budget, run.base, d, _baseline_forward(run), backward=True)


def probe(run: Run, budget: Budget) -> None:
    run.table_head()
    for d in run.sizes.head_dims:
        for mode, round_z in PROBE_ROWS:
            label = _probe_label(mode, round_z)
            if run.probe is None:
                run.skipped(label, d, run.probe_missing)
            else:
                run.timed(budget, label, d, _probe_forward(run, mode, round_z, run.sizes.t, d))


def mgpu(run: Run, budget: Budget) -> None:
    run.table_head()
    for d in run.sizes.head_dims:
        if run.on_gpu:
            run.timed(budget, "attention_mgpu, float16", d, _mgpu_forward, dtype="float16")
        else:
            run.skipped("attention_mgpu, float16", d, MGPU_OFF_GPU)


def pallas(run: Run, budget: Budget) -> None:
    run.table_head()
    for d in run.sizes.head_dims:
        run.timed(budget, "lssa, pallas", d, _pallas_lssa, backward=True)


def errors(run: Run, budget: Budget) -> None:
    """Each kernel's output error against float32 on the same inputs, beside one rounding of the float32 result to the
    kernel's dtype: max |out - ref| / max |ref| (the note's form)."""
    t, d = run.sizes.error_t, run.sizes.head_dims[0]
    run.report(
        f"T={t}, D={d}, H={run.sizes.heads}, causal; error = max |out - ref32| / max |ref32|; rounding: the same of ref32 "
        "rounded once to the row's dtype\n",
        "| row | dtype | error | rounding | x rounding |",
        "|---|---|---|---|---|",
    )
    softmax_ref = functools.partial(attention.attend, variant="softmax", implementation="reference")
    lssa_ref = functools.partial(attention.attend, variant="lssa", implementation="reference")
    rows: list[tuple[str, str, Callable | str, Callable]] = [(run.base, "bfloat16", _baseline_forward(run), softmax_ref)]
    rows.append(("attention_mgpu, float16", "float16", _mgpu_forward if run.on_gpu else MGPU_OFF_GPU, softmax_ref))
    for mode, round_z in PROBE_ROWS:
        forward = run.probe_missing or _probe_forward(run, mode, round_z, t, d)
        rows.append((_probe_label(mode, round_z), "bfloat16", forward, lambda q, k, v: lssa_reference(q, k, v, lssa_scale(t, d))))
    rows.append(("lssa, pallas", "bfloat16", _pallas_lssa, lssa_ref))
    for label, dtype, forward, reference in rows:
        if isinstance(forward, str) or not budget.left():
            run.report(f"| {label} | {dtype} | {forward if isinstance(forward, str) else 'not reached'} | | |")
            continue
        q, k, v = inputs(t, run.sizes.heads, d, dtype)[:3]
        try:
            out = np.asarray(jax.jit(forward)(q, k, v), np.float32)
        except Exception as error:
            run.report(f"| {label} | {dtype} | error: {_first_line(error)} | | |")
            continue
        ref = np.asarray(jax.jit(reference)(*(x.astype(jnp.float32) for x in (q, k, v))), np.float32)
        scale = max(float(np.max(np.abs(ref))), 1e-30)
        err = float(np.max(np.abs(out - ref))) / scale
        rounding = float(np.max(np.abs(ref.astype(dtype).astype(np.float32) - ref))) / scale
        run.report(f"| {label} | {dtype} | {err:.2e} | {rounding:.2e} | {err / rounding:.2f} |")


STEPS = {"baseline": baseline, "probe": probe, "mgpu": mgpu, "errors": errors, "pallas": pallas}


def decision(run: Run) -> str:
    """The note's rule on the better of poly4 and split4 at the first head dim."""
    d = run.sizes.head_dims[0]
    ratios = {mode: run.fwd_ratio(_probe_label(mode, True), d) for mode in ("poly4", "split4")}
    measured = {mode: r for mode, r in ratios.items() if r is not None}
    if not measured:
        return f"route decision: not measured (no poly4 or split4 forward beside {run.base}'s at D={d})"
    best = max(measured.values())
    build, tune = ROUTE_RULE
    if best >= build:
        verdict = f">= {build}x: build the LSSA backward next"
    elif best < tune:
        verdict = f"< {tune}x: hand-tune the elementwise code first (inline_mgpu, the MUFU/FMA split ratio)"
    else:
        verdict = f"between {tune}x and {build}x: the rule decides neither way"
    each = ", ".join(f"{mode} {r:.3g}x" for mode, r in measured.items())
    return f"route decision (T={run.sizes.t}, D={d}; {each} {run.base}'s forward; best {best:.3g}x): {verdict}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on any machine (CPU: interpret mode)")
    parser.add_argument("--probe", help="the folder holding the research note's lssa_mgpu.py")
    parser.add_argument("--budget_scale", type=float, default=1.0, help="every step's seconds times this (0: no row)")
    args = parser.parse_args(argv)
    sizes, slack = (TINY, TINY_SLACK) if args.tiny else (FULL, 1)
    out = os.environ.get("OUT")
    report = Report(os.path.join(out, "device_route.md") if out else None)
    hard_limit(LIMIT * slack, report)
    dump = os.path.join(out, "mosaic_dump") if out else None
    if dump:  # read by the CUDA plugin at each Mosaic GPU compile
        os.makedirs(dump, exist_ok=True)
        os.environ.setdefault("MOSAIC_GPU_DUMP_TO", dump)
    module, missing = load_probe(args.probe)
    run = Run(sizes, report, module, missing)
    device = jax.devices()[0]
    report(
        f"# Device route (`python benchmarks/device_route.py {' '.join(sys.argv[1:] if argv is None else argv)}`)\n",
        "| jax | backend | device | probe | T | H | baseline |",
        "|---|---|---|---|---|---|---|",
        f"| {jax.__version__} | {jax.default_backend()} | {device.device_kind} | {missing or 'loaded'} | {sizes.t} | "
        f"{sizes.heads} | {run.base} |",
    )
    for name, step in STEPS.items():
        seconds = STEP_SECONDS[name] * slack * args.budget_scale
        report(f"\n## {name} (budget {seconds:.0f} s)\n")
        start = time.monotonic()
        step(run, Budget(seconds))
        report(f"\n{name}: {time.monotonic() - start:.0f} s")
    report("", decision(run))
    if dump:
        files = len(os.listdir(dump)) if os.path.isdir(dump) else 0
        report(f"Mosaic GPU dumps: {files} files in {os.environ['MOSAIC_GPU_DUMP_TO']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
