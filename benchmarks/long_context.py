"""Long-context training steps compiled without the chips: gpt2_small with context parallelism, up to a million tokens.

    python benchmarks/long_context.py [--cases v5p-32:1048576:16,8xh100:524288:8,v5e-16:262144:16]
                                      [--variants lssar,softmax,ssmax] [--implementations pallas]
                                      [--loss_chunking on] [--out benchmarks/long_context.csv]

Each case is target:T:context: one optimiser step of gpt2_small (12 layers, 12 heads of 64, vocab 50,257),
batch 1 per data replica, full remat, bf16 compute, the sequence split over `context` devices (ring attention,
zig-zag). Prints per-device memory against the chip's HBM (headroom = 1 - peak / HBM), the Pallas kernel calls
per device and the largest sequence length any kernel operand carries (T / context when the ring runs the
kernels on the chunks; 0 kernels when it runs the blockwise rules). --loss_chunking off: the loss holds the
whole logits (the memory before training.loss chunked it). Rows are appended to --out as they finish; a case
already there is skipped (rerun resumes). Compiles take minutes each on 2 cores.
"""

import argparse
import csv
import math
import os
import pathlib
import sys
import time

FIELDS = ("target", "T", "context", "variant", "implementation", "loss_chunking", "result", "peak_gib", "hbm_gib",
          "headroom", "kernels", "kernel_length", "rotations_exposed", "compile_s")  # fmt: skip


def step_config(target: str, t: int, context: int, variant: str, implementation: str):
    """The case's training config: gpt2_small, full remat, bf16, batch 1 per data replica, T split over `context`
    (a target of several slices, `2xv5p-32`: data parallel across them)."""
    from freeatten_jax.compile import targets
    from freeatten_jax.configs import base

    cfg = base.get_config(variant, "gpt2_small")
    replicas = len(targets.devices(target)) // context
    cfg.model.implementation, cfg.model.remat, cfg.model.dtype = implementation, "full", "bfloat16"
    cfg.mesh.shape, cfg.mesh.slices = (replicas, 1, 1, context), targets.parse(target).slices
    cfg.train.seq_len, cfg.train.batch_size, cfg.train.grad_accum_steps = t, replicas, 1
    return cfg


def _case(target: str, t: int, context: int, variant: str, implementation: str, chunking: str) -> dict:
    """One compile's row."""
    from freeatten_jax.compile import DoesNotFit, compile_train_step
    from freeatten_jax.training import loss

    loss.MAX_LOGITS = loss.MAX_LOGITS if chunking == "on" else 2**62
    cfg = step_config(target, t, context, variant, implementation)
    row = dict(target=target, T=t, context=context, variant=variant, implementation=implementation, loss_chunking=chunking)
    start = time.time()
    try:
        report = compile_train_step(cfg, target)
    except DoesNotFit as e:
        return {**row, "result": f"error: {e}", "compile_s": f"{time.time() - start:.0f}"}
    d = cfg.model.d_model // cfg.model.num_heads  # q_BHTD's length: its rows x width / D (a TPU kernel's are packed)
    lengths = {math.prod(max(call, key=math.prod)[2:]) // d for call in report.kernel_operands if call}
    return {
        **row,
        "result": "ok",
        "peak_gib": f"{report.peak / 2**30:.2f}",
        "hbm_gib": f"{report.hbm / 2**30:.0f}",
        "headroom": f"{1 - report.peak / report.hbm:.2f}",
        "kernels": report.kernels,
        "kernel_length": max(lengths, default=0),
        "rotations_exposed": f"{len(report.rotations[1])}/{report.rotations[0]}",  # ring permutes overlapping no kernel
        "compile_s": f"{time.time() - start:.0f}",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="v5p-32:1048576:16,8xh100:524288:8,v5e-16:262144:16")
    parser.add_argument("--variants", default="lssar,softmax,ssmax")
    parser.add_argument("--implementations", default="pallas")
    parser.add_argument("--loss_chunking", default="on", choices=("on", "off"))
    parser.add_argument("--out", default="benchmarks/long_context.csv")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    out = pathlib.Path(args.out)
    done = set()
    if out.exists():
        with out.open() as f:
            done = {tuple(r[k] for k in FIELDS[:6]) for r in csv.DictReader(f)}
    else:
        out.write_text(",".join(FIELDS) + "\n")
    print("| " + " | ".join(FIELDS) + " |\n|" + "---|" * len(FIELDS), flush=True)
    failed = 0
    for case in args.cases.split(","):
        target, t, context = case.split(":")
        for implementation in args.implementations.split(","):
            for variant in args.variants.split(","):
                key = (target, t, context, variant, implementation, args.loss_chunking)
                if key in done:
                    continue
                row = _case(target, int(t), int(context), variant, implementation, args.loss_chunking)
                failed += row["result"] != "ok" or float(row["headroom"]) < 0.10
                with out.open("a") as f:
                    csv.DictWriter(f, FIELDS).writerow(row)
                print("| " + " | ".join(str(row.get(k, "")) for k in FIELDS) + " |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
