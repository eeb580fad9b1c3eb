"""The full compile matrix (`make compile-check`): every variant's Pallas forward+backward at several lengths
on TPU and NVIDIA targets, compiled without the chips (freeatten_jax.compile; pip install '.[compile]').

    python benchmarks/compile_matrix.py [--targets v5e-8,v5p-8,v6e-8,h100,h200] [--lengths 8192,32768,131072]

B = 1, 16 heads of 128, bf16, causal, one device of each target. Prints target x T x variant -> ok with the
peak memory per device, or the one-line overflow; exits 1 if any case fails.
"""
import argparse
import os
import sys
import time

VARIANTS = ("softmax", "ssmax", "lssa", "lssar", "sigmoid", "relu")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="v5e-8,v5p-8,v6e-8,h100,h200")
    parser.add_argument("--lengths", default="8192,32768,131072")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from freeatten_jax.compile import DoesNotFit, compile_attention

    failed = 0
    print("| target | T | variant | result | peak per device | kernels | compile s |")
    print("|---|---|---|---|---|---|---|")
    for target in args.targets.split(","):
        for length in (int(x) for x in args.lengths.split(",")):
            for variant in args.variants.split(","):
                start = time.time()
                try:
                    report = compile_attention(target, variant=variant, seq_len=length)
                    result, peak, kernels = "ok", f"{report.peak / 2**30:.2f} GiB", str(report.kernels)
                except DoesNotFit as e:
                    failed, result, peak, kernels = failed + 1, f"error: {e}", "", ""
                print(f"| {target} | {length} | {variant} | {result} | {peak} | {kernels} | {time.time() - start:.0f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
