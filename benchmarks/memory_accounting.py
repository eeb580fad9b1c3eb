"""Where a long-context training step's memory goes: the buffers XLA keeps live at the step's peak, compiled
without the chips, against the floor computed from the model's shapes.

    python benchmarks/memory_accounting.py [--case v5p-32:1048576:16] [--variant lssar] [--implementation pallas]
                                           [--layers 12] [--top 20]

The step is benchmarks/long_context.py's (gpt2_small, batch 1 per data replica, full remat, bf16, loss chunked).
XLA's own dump (`xla_dump_to`, read from `*after_optimizations-live-range.txt`, `*-buffer-assignment.txt` and the
optimized HLO) lists every buffer live at the peak: its bytes as laid out on the chip, its shape, the HLO op that
made it and a category (arguments: parameters, optimizer state, the batch; row statistics: [.., 1] float32
arrays, which a TPU pads 128x; the rest by the op's name). The floor is what must live: the state (parameters,
gradients and Adam's two moments, as sharded), each layer's saved input under full remat, and one layer's
recompute working set (q, k, v, the attention output and their gradients; the MLP's two activations and a
gradient), all as unpadded bytes per chip. It also counts, over the whole step, the arrays the kernels write that the chip
lays out at twice their bytes or more (a [.., 64] row padded to 128 lanes: none since the TPU kernels pack them).
"""

import argparse
import collections
import glob
import math
import os
import re
import sys
import tempfile
from typing import NamedTuple

import long_context

DTYPE_BYTES = {"f32": 4, "bf16": 2, "s32": 4, "u32": 4, "pred": 1, "f16": 2, "s8": 1, "u8": 1}
_PEAK = re.compile(r"Live ranges at \d+ \(peak\):\n((?:    .*\n)+)")
_LIVE = re.compile(r"    (\S+): (\d+) bytes")
_VALUE = re.compile(r" value: <\d+ (\S+?)(?: @\d+)?> \(size=(\d+),offset=\d+\): (.*)$", re.M)
_OP_NAME = re.compile(r'^\s*(?:ROOT )?%(\S+) = .*?metadata=\{op_name="((?:[^"\\]|\\.)*)"', re.M)


def logical_bytes(shape: str) -> int:
    """Bytes of an array shape written as XLA writes it (`f32[1,12,8192,1]{3,2,1,0:T(8,128)}`) without layout padding;
    a tuple's leaves summed."""
    total = 0
    for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", shape):
        total += DTYPE_BYTES.get(dtype, 4) * math.prod(int(n) for n in dims.split(",") if n)
    return total


def category(name: str, shape: str, origin: str) -> str:
    """What a live buffer is, from its HLO name, shape and op name."""
    if name.startswith("param"):
        return "arguments (parameters, optimizer state, batch)"
    if re.fullmatch(r"f32\[[\d,]*,1\]\{.*", shape):
        return "row statistics [.., 1] float32 (lane-padded)"
    if "freeatten_" in name or "freeatten_" in origin:
        return "attention kernels' outputs"
    if "collective-permute" in name:
        return "ring: blocks in flight"
    if "transpose(jvp" in origin:
        return "backward temporaries"
    return "forward and other temporaries"


class Dump(NamedTuple):
    """XLA's dump of the compiled step, each file read once."""

    peak: str  # the live-range report's peak section
    values: list[tuple[str, str, str]]  # (HLO value, bytes as laid out, shape) of every buffer-assigned value
    origins: dict[str, str]  # HLO instruction -> its op name
    report: str  # the memory-usage report


def _dump_file(folder: str, suffix: str) -> str:
    """The text of the one dump file of the optimized step named with `suffix`."""
    (path,) = glob.glob(os.path.join(folder, f"*after_optimizations{suffix}.txt"))
    return open(path).read()


def read_dump(folder: str) -> Dump:
    """The dump in `folder` (xla_dump_to), parsed once for the readers below."""
    return Dump(
        _PEAK.search(_dump_file(folder, "-live-range")).group(1),
        _VALUE.findall(_dump_file(folder, "-buffer-assignment")),
        dict(_OP_NAME.findall(_dump_file(folder, ""))),
        _dump_file(folder, "-memory-usage-report"),
    )


def live_at_peak(dump: Dump):
    """[(bytes, name, shape, origin)] of the buffers live at the peak, largest first."""
    shapes = {name: shape.strip() for name, _, shape in dump.values}
    rows = []
    for name, size in _LIVE.findall(dump.peak):
        base = name.split("{")[0]
        shape = shapes.get(name, shapes.get(base, "?"))
        rows.append((int(size), name, shape, dump.origins.get(base, "").replace("\\'", "'")))
    return sorted(rows, reverse=True)


def padded_kernel_outputs(dump: Dump) -> list[tuple[int, str, str]]:
    """(bytes as laid out, HLO value, shape) of every array a Pallas kernel writes that the chip lays out at twice its
    bytes or more, over the whole step (a [.., 64] row padded to 128 lanes; a [.., 1] column 128x)."""
    return [
        (int(size), name, shape.strip())
        for name, size, shape in dump.values
        if "freeatten_" in dump.origins.get(name.split("{")[0], "") and int(size) >= 2 * logical_bytes(shape) > 0
    ]


def packed_bytes(dump: Dump) -> int:
    """Bytes of the main memory the buffer assignment (before the TPU's codegen passes) gives the program: its
    parameters and its preallocated temporary heap, every buffer at its packed offset (the dump's memory-space report)."""
    return int(re.search(r"Memory Space: default \(color=0\)\nTotal bytes: (\d+)", dump.report).group(1))


def floor_bytes(cfg, devices) -> dict[str, int]:
    """What must live per chip (unpadded): the state (each parameter's shard, as float32 parameter, gradient and Adam's
    two moments), the saved layer inputs and one layer's working set of the T / context tokens a chip holds."""
    import jax

    from freeatten_jax.nn import sharding
    from freeatten_jax.training import optim
    from freeatten_jax.training import state as train_state

    mesh = sharding.make_mesh(cfg.mesh.shape, list(devices), cfg.mesh.slices)
    abstract, _ = train_state.abstract_state(cfg, mesh, optim.make(cfg.optim, cfg.train.steps))
    shard = lambda x: math.prod(x.sharding.shard_shape(x.shape))  # noqa: E731
    params = sum(shard(x) for x in jax.tree.leaves(abstract["params"]))
    m, tokens, act = cfg.model, cfg.train.seq_len * cfg.train.batch_size // len(devices), 2  # bfloat16 activations
    return {
        "state": 16 * params,
        "saved layer inputs": m.num_layers * tokens * m.d_model * act,
        "one layer's working set": tokens * act * (8 * m.d_model + 3 * m.mlp_dim),
    }


class Accounting(NamedTuple):
    peak: int  # XLA's memory analysis: arguments + outputs - aliased + temporaries
    rows: list  # [(bytes, name, shape, origin)] live at the peak, largest first
    packed: int  # the arguments and the temporaries' heap as the buffer assignment packed it, before codegen
    floor: dict[str, int]
    layers: int
    padded: list  # padded_kernel_outputs

    def by_category(self) -> dict[str, list[int]]:
        """{category: [bytes as laid out, bytes unpadded, buffers]}, largest first."""
        totals = collections.defaultdict(lambda: [0, 0, 0])
        for size, name, shape, origin in self.rows:
            one = totals[category(name, shape, origin)]
            one[0], one[1], one[2] = one[0] + size, one[1] + logical_bytes(shape), one[2] + 1
        return dict(sorted(totals.items(), key=lambda kv: -kv[1][0]))


def account(case: str, variant: str = "lssar", implementation: str = "pallas", layers: int | None = None) -> Accounting:
    """Compiles the case's step (`target:T:context`) with XLA's dumps and reads them."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from freeatten_jax.compile import targets
    from freeatten_jax.compile.run import lower_train_step
    from freeatten_jax.training import config

    target, t, context = case.split(":")
    cfg = long_context.step_config(target, int(t), int(context), variant, implementation)
    if layers:
        cfg.model.num_layers = layers
    typed = config.parse(cfg, reads_data=False)
    folder = tempfile.mkdtemp(prefix="memory_accounting_")
    options = {"xla_dump_to": folder, "xla_dump_hlo_as_text": True, "xla_dump_hlo_module_re": ".*train_step.*"}
    compiled = lower_train_step(typed, targets.devices(target)).compile(compiler_options=options)
    memory = compiled.memory_analysis()
    peak = memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes + memory.temp_size_in_bytes
    floor = floor_bytes(typed, targets.devices(target))
    dump = read_dump(folder)
    return Accounting(peak, live_at_peak(dump), packed_bytes(dump), floor, typed.model.num_layers, padded_kernel_outputs(dump))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="v5p-32:1048576:16", help="target:T:context")
    parser.add_argument("--variant", default="lssar")
    parser.add_argument("--implementation", default="pallas")
    parser.add_argument("--layers", type=int, help="num_layers (default: gpt2_small's 12)")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    found = account(args.case, args.variant, args.implementation, args.layers)
    gib = lambda x: x / 2**30  # noqa: E731
    live, floor = sum(r[0] for r in found.rows), sum(found.floor.values())
    print(f"{args.case} {args.variant} {args.implementation}, {found.layers} layers: peak per chip "
          f"{gib(found.peak):.2f} GiB (XLA's memory analysis; {found.peak / floor:.2f}x the floor), live at the peak "
          f"{gib(live):.2f} GiB ({live / floor:.2f}x); floor {gib(floor):.2f} GiB "
          f"({', '.join(f'{k} {gib(v):.2f}' for k, v in found.floor.items())})")  # fmt: skip
    print(f"between them: {gib(found.packed - live):.2f} GiB of packing (the buffer assignment's heap, "
          f"{gib(found.packed):.2f} GiB with the arguments, holds the live buffers at offsets that leave gaps) "
          f"and {gib(found.peak - found.packed):.2f} GiB that the passes after it add (not in the dump)")  # fmt: skip
    print(f"kernel outputs laid out at twice their bytes or more: {len(found.padded)} values, "
          f"{gib(sum(size for size, _, _ in found.padded)):.2f} GiB")  # fmt: skip
    print("\n| live at the peak, by category | GiB as laid out | GiB unpadded | buffers |\n|---|---|---|---|")
    for name, (size, logical, count) in found.by_category().items():
        print(f"| {name} | {gib(size):.2f} | {gib(logical):.2f} | {count} |")
    print(f"\n| top {args.top} buffers | GiB | shape | padding | HLO value | op |\n|---|---|---|---|---|---|")
    for size, name, shape, origin in found.rows[: args.top]:
        padding, shape = size / max(logical_bytes(shape), 1), shape.split("{")[0]
        print(f"| {category(name, shape, origin)} | {gib(size):.3f} | `{shape}` | {padding:.0f}x | {name} | {origin[-90:]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
