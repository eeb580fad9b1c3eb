"""The full compile matrix (`make compile-check`): every variant's Pallas forward+backward at several lengths
on TPU and NVIDIA targets, compiled without the chips (freeatten_jax.compile; pip install '.[compile]').

    python benchmarks/compile_matrix.py [--targets v5e-8,v5p-8,v6e-8,h100,h200] [--lengths 8192,32768,131072]
                                        [--steps v5p-8,8xh100]

B = 1, 16 heads of 128, bf16, causal, one device of each target. Prints target x T x variant -> ok with the
peak memory per device, or the one-line overflow. Then the gpt2_small lssar training step with
implementation="pallas" on each --steps target's data mesh (T = 1024, 8 sequences per device) and the
batch its kernels see: the per-device 8, not the global batch. Exits 1 if any case fails.
"""

import argparse
import math
import os
import sys
import time

VARIANTS = ("softmax", "ssmax", "lssa", "lssar", "sigmoid", "relu")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="v5e-8,v5p-8,v6e-8,h100,h200")
    parser.add_argument("--lengths", default="8192,32768,131072")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", default="v5p-8,8xh100", help="targets of the gpt2_small pallas step ('' for none)")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from freeatten_jax.compile import DoesNotFit, compile_attention, compile_train_step, targets
    from freeatten_jax.configs import base

    failed = 0
    print("| target | T | variant | result | peak per device | kernels | compile s |")
    print("|---|---|---|---|---|---|---|")
    for target in filter(None, args.targets.split(",")):
        for length in (int(x) for x in args.lengths.split(",")):
            for variant in args.variants.split(","):
                start = time.time()
                try:
                    report = compile_attention(target, variant=variant, seq_len=length)
                    result, peak, kernels = "ok", f"{report.peak / 2**30:.2f} GiB", str(report.kernels)
                except DoesNotFit as e:
                    failed, result, peak, kernels = failed + 1, f"error: {e}", "", ""
                print(
                    f"| {target} | {length} | {variant} | {result} | {peak} | {kernels} | {time.time() - start:.0f} |", flush=True
                )
    print(
        "\n| target | gpt2_small lssar pallas step, T = 1024 | global batch | batch the kernels see | peak per device | kernels | compile s |"  # noqa: E501
    )
    print("|---|---|---|---|---|---|---|")
    for target in filter(None, args.steps.split(",")):
        cfg = base.get_config("lssar", "gpt2_small")
        cfg.model.implementation, cfg.model.vocab_size, cfg.data.source = (
            "pallas",
            50257,
            "shakespeare",
        )  # GPT-2's vocabulary, no shards needed
        cfg.train.batch_size, cfg.train.grad_accum_steps = 8 * len(targets.devices(target)), 1
        start = time.time()
        try:
            report = compile_train_step(cfg, target)
            seen = sorted({max(call, key=math.prod)[0] for call in report.kernel_operands})  # q_BHTD's batch
            result, peak, kernels = "ok", f"{report.peak / 2**30:.2f} GiB", str(report.kernels)
            failed += seen != [8]
        except DoesNotFit as e:
            failed, result, peak, kernels, seen = failed + 1, f"error: {e}", "", "", ""
        print(
            f"| {target} | {result} | {cfg.train.batch_size} | {seen} | {peak} | {kernels} | {time.time() - start:.0f} |",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
