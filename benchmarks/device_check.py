"""One-command device check for the Pallas kernels (issue 10), sized for 8 minutes on one H200.

  python benchmarks/device_check.py           # GPU: the kernel tests on the real kernels, then the benchmark
  python benchmarks/device_check.py --tiny    # any machine (CPU too): the same steps at tiny sizes, to prove the script

Step 1 runs tests/test_pallas.py and tests/test_block_edges.py with FREEATTEN_PALLAS_INTERPRET=0
(compiled Triton kernels on a GPU; on a CPU the platform still picks interpret mode). Step 2 runs
benchmarks/attention.py at T=8192, B=1, H=16, D=128, bf16, causal, fwd+bwd: cuDNN softmax baseline,
Pallas and blockwise LSSA, LSSAR and softmax over 4 packed documents, with issue 10's targets as
ratios and each row's fraction of the bf16 peak. Each step has its own time limit. Writes
device_check.md (a summary with each step's output) and attention.md under $OUT when set.
Needs only jax (0.10.2 or 0.11.x with CUDA), numpy, pytest and absl (which optax brings).
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_FILES = ["tests/test_pallas.py", "tests/test_block_edges.py"]
FULL = dict(tests=[], lengths="8192", heads="16", head_dim="128", repeats="5", extra=[])
# --tiny: only the lowering tests, and a two-head, T=256 table (blockwise only: interpret mode is slow)
TINY = dict(tests=["-k", "lowers"], lengths="256", heads="2", head_dim="16", repeats="1", extra=["--peak-tflops", "1"])


def _step(name: str, command: list[str], env: dict, timeout: int) -> tuple[str, int, float, str]:
    """Runs one step in ROOT; its name, exit status (124: timed out), seconds and output."""
    start = time.perf_counter()
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        status, output = result.returncode, result.stdout + result.stderr
    except subprocess.TimeoutExpired as error:
        status, output = 124, f"{error.stdout or ''}{error.stderr or ''}\n(timed out after {timeout} s)"
    seconds = time.perf_counter() - start
    print(f"== {name}: exit {status}, {seconds:.0f} s\n{output[-6000:]}", flush=True)
    return name, status, seconds, output


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes; runs anywhere, proves the script")
    parser.add_argument("--test-timeout", type=int, default=240)
    parser.add_argument("--bench-timeout", type=int, default=240)
    args = parser.parse_args()
    sizes = TINY if args.tiny else FULL
    out_dir = os.environ.get("OUT")
    env = {**os.environ, "FREEATTEN_PALLAS_INTERPRET": "0", "PYTHONUNBUFFERED": "1"}
    env.setdefault("JAX_PLATFORMS", "" if not args.tiny else "cpu")  # tests/conftest.py would force the CPU
    table = os.path.join(out_dir, "attention.md") if out_dir else os.devnull
    implementations = "blockwise" if args.tiny else "pallas,blockwise"
    bench = [sys.executable, "benchmarks/attention.py", "--lengths", sizes["lengths"], "--heads", sizes["heads"],
             "--head-dim", sizes["head_dim"], "--variants", "lssa,lssar", "--implementations", implementations,
             "--packed", "4", "--repeats", sizes["repeats"], "--output", table, *sizes["extra"]]
    steps = [
        _step("environment", [sys.executable, "-c", "import jax; print(jax.__version__, jax.devices())"], env, 120),
        _step("kernel tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TEST_FILES, *sizes["tests"]],
              env, args.test_timeout),
        _step("benchmark", bench, env, args.bench_timeout),
    ]
    summary = ["# Device check (benchmarks/device_check.py" + (" --tiny" if args.tiny else "") + ")", "",
               "| step | exit | seconds |", "|---|---|---|"]
    summary += [f"| {name} | {status} | {seconds:.0f} |" for name, status, seconds, _ in steps]
    for name, _, _, output in steps:
        summary += ["", f"## {name}", "", "```", output[-20000:].strip(), "```"]
    if out_dir:
        with open(os.path.join(out_dir, "device_check.md"), "w") as f:
            f.write("\n".join(summary) + "\n")
    return max(status for _, status, _, _ in steps)


if __name__ == "__main__":
    sys.exit(main())
