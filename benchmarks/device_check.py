"""One command for the day a GPU is lent: the Pallas kernels checked and timed in at most 8 minutes.

  python benchmarks/device_check.py           # GPU: real sizes (benchmarks/device_steps.py FULL)
  python benchmarks/device_check.py --tiny    # any machine (CPU: interpret mode), tiny sizes, to prove the script

Each step runs in its own process under its own limit (STEP_LIMITS, 460 s together, so the whole check
ends within 8 minutes by construction): the environment; correctness at T=2048, D=128, bf16,
default blocks, each variant's error in values and gradients over the bf16 reference's own (cuDNN's
beside softmax's); every variant's Pallas row beside cuDNN softmax at T=8192 and 32768 (both dK/dV key
blocks); packed documents against cuDNN given
the same documents as a batch; the block-size sweep whose fastest blocks fill the GPU block table; the
kernel tests on the compiled kernels. Writes $OUT/device_check.md (the summary, then each step's table)
when $OUT is set. Needs only the standard library here; the steps need jax, numpy and pytest (no grain,
ml_collections, tokenizers, matplotlib).
"""

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_LIMITS = {
    "environment": 20,
    "correctness": 190,
    "unpacked": 70,
    "long": 70,
    "packed": 30,
    "sweep": 60,
    "kernel tests": 20,
}  # seconds
MARGIN = 10  # seconds a step keeps after its last row starts, to print and exit before its limit
TINY_SLACK = 4  # --tiny's limits are this many times the device's: it proves the script on CPUs a test suite loads
KERNEL_TESTS = ["tests/attention/pallas/test_kernels.py", "tests/attention/test_block_edges.py"]


def _command(name: str, limit: int, tiny: bool) -> list[str]:
    if name == "kernel tests":  # the refusal tests (the correctness step holds the values; the suite runs the rest)
        return [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            *KERNEL_TESTS,
            "-k",
            "bad_options_are_refused",
        ]
    seconds = str(limit - MARGIN)
    return [sys.executable, "benchmarks/device_steps.py", name, "--seconds", seconds, *(["--tiny"] if tiny else [])]


def _step(name: str, command: list[str], env: dict, limit: int) -> tuple[int, float, str]:
    """Runs one step in ROOT under its limit: exit status (124: killed at the limit), seconds, output."""
    start = time.perf_counter()
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        status, output = result.returncode, result.stdout + result.stderr[-3000:] * bool(result.returncode)
    except subprocess.TimeoutExpired as error:
        text = lambda x: x.decode() if isinstance(x, bytes) else x or ""  # noqa: E731
        status, output = 124, f"{text(error.stdout)}{text(error.stderr)[-3000:]}\n(killed at its {limit} s limit)"
    seconds = time.perf_counter() - start
    print(f"== {name}: exit {status}, {seconds:.0f} s of {limit}\n{output.strip()}\n", flush=True)
    return status, seconds, output


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes; runs anywhere, proves the script")
    args = parser.parse_args(argv)
    env = {
        **os.environ,
        "FREEATTEN_PALLAS_INTERPRET": "0",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
    }
    env.setdefault("JAX_PLATFORMS", "cpu" if args.tiny else "")  # tests/conftest.py would force the CPU
    if args.tiny:  # unoptimised CPU code from the classic emitters compiles faster; tiny timings say nothing anyway
        env["XLA_FLAGS"] = (
            f"{env.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
            " --xla_cpu_use_fusion_emitters=false"
        )
    limits = {name: limit * (TINY_SLACK if args.tiny else 1) for name, limit in STEP_LIMITS.items()}
    results = {name: _step(name, _command(name, limit, args.tiny), env, limit) for name, limit in limits.items()}
    summary = [
        f"# Device check (`python benchmarks/device_check.py{' --tiny' * args.tiny}`)",
        "",
        "| step | exit | seconds | limit s |",
        "|---|---|---|---|",
    ]
    summary += [f"| {name} | {status} | {seconds:.0f} | {limits[name]} |" for name, (status, seconds, _) in results.items()]
    for name, (_, _, output) in results.items():
        summary += ["", f"## {name}", "", output.strip()]
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "device_check.md"), "w") as f:
            f.write("\n".join(summary) + "\n")
    return max(status for status, _, _ in results.values())


if __name__ == "__main__":
    sys.exit(main())
