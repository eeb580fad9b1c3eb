"""Per-grid-step budget of the TPU (Mosaic) kernels from their final VLIW bundles, compiled without a TPU.

Used by `python benchmarks/kernel_budget.py --target v5e` (or v5p, v6e). libtpu writes each kernel's schedule
when asked through LIBTPU_INIT_ARGS (dump_flags, set before jax is imported; only the final bundles' pass, which
halves a compile's time): `*-freeatten_<family>_<kind>.*-final_bundles.txt`, one bundle a line, with `Start region N` /
`End region N` markers. Each `pl.when` of a kernel is a region; the grid step's block work (one key block of
one pass, or one query block in dK/dV) is a region holding `vmatmul`s and no region that holds one, and
pallas/tpu.py emits them in pairs, masked then interior, per pass. A key block's interior path is the sum of the
interior regions' bundles (every pass of LSSAR's forward visits each key block) plus, per grid step, the
bundles of the step's body that no branch skips. The bound assumes one bundle a cycle and MACS_PER_CYCLE for
the MXUs (peak bf16 FLOP/s / 2 / clock); it is a static upper bound (1.0 = the path could be MXU-bound), not a
measured speed: DMA waits and the pipeline's own per-step cost are not in it.
"""

import collections
import glob
import os
import re

# per TensorCore per cycle: v5e 197 TF/s at 1.5 GHz and v5p 459 TF/s over 2 cores at 1.75 GHz are four
# 128 x 128 MXUs; v6e 918 TF/s at 1.75 GHz is four 256 x 256 ones (clocks: public spec sheets, not verified here)
MACS_PER_CYCLE = {"v5e": 4 * 128 * 128, "v5p": 4 * 128 * 128, "v6e": 4 * 256 * 256}
TOPOLOGY = {"v5e": "tpu:v5e:1x1", "v5p": "tpu:v5:1x1x1", "v6e": "tpu:v6e:1x1"}
MODEL_MACS = {"fwd": 2, "bwd": 5}  # MACs per score in units of D (FlashAttention-2's 4·D and 10·D FLOP)
EUP = ("vpow2.f32", "vlog2.f32", "vrcp.f32")
BUNDLE = re.compile(r"^\s*(?:0x[0-9a-f]+|\d+)\s+(?:[A-Z]{2}:\s*)*[:>{]")  # an address, markers (LB:, PF:, ...)


def dump_flags(folder: str) -> str:
    return f"--xla_jf_dump_to={folder} --xla_jf_dump_llo_text=true --xla_jf_dump_llo_pass_label_regex=final_bundles"


def opcodes(line: str):
    """The opcodes of one bundle line (`{ %x = vmul.f32 ... ;; %y = vpow2.f32 ... }`)."""
    body = line.split("{", 1)[1].rsplit("}", 1)[0] if "{" in line else ""
    for ins in body.split(";;"):
        found = re.match(r"\s*(?:%\S+\s*=\s*)?([a-z][\w.]*)", ins.split("/*")[0])
        if found:
            yield found.group(1)


def regions(lines):
    """({region: (first, last) bundle index}, {region: first bundle}) from the region markers: the spans of the
    regions that hold bundles, and where every region (empty ones too: branch targets) starts."""
    spans, open_at, starts = {}, {}, {}
    for n, line in enumerate(lines):
        for kind, number in re.findall(r"(Start/End empty|Start|End) region (\d+)", line):
            region = int(number)
            if kind == "End":
                if region in open_at:
                    spans[region] = (open_at.pop(region), n)
                continue
            starts.setdefault(region, n)
            if kind == "Start":
                open_at[region] = n
    return spans, starts


def step_regions(lines):
    """The block-work regions in code order, each as a Counter of its opcodes plus "bundles", and the (first, last)
    bundle of the smallest region around them all."""
    spans, _ = regions(lines)
    counts = {}
    for region, (a, b) in spans.items():
        counter = collections.Counter(op for line in lines[a : b + 1] for op in opcodes(line))
        counter["bundles"] = b - a + 1
        counts[region] = counter

    def has_matmul(region):
        return any(op.startswith("vmatmul") for op in counts[region])

    def inside(inner, outer):
        return inner != outer and spans[outer][0] <= spans[inner][0] and spans[inner][1] <= spans[outer][1]

    leaves = [r for r in spans if has_matmul(r) and not any(has_matmul(o) and inside(o, r) for o in spans)]
    around = [r for r in spans if all(inside(leaf, r) for leaf in leaves)]
    body = spans[min(around, key=lambda r: spans[r][1] - spans[r][0])]
    return [counts[r] for r in sorted(leaves, key=lambda r: spans[r][0])], body


def every_step(lines, body) -> int:
    """Bundles of the step's body (first, last: the smallest region around all block work) that no forward branch
    inside it skips: what every grid step runs besides its block work (index arithmetic, DMA bookkeeping, and
    anything not under a `pl.when`)."""
    _, starts = regions(lines)
    skipped = set()
    for n in range(body[0], body[1] + 1):
        for region in re.findall(r"sbr\.rel .*?target = \$region(\d+)", lines[n]):
            if starts.get(int(region), -1) > n:
                skipped.update(range(n + 1, starts[int(region)]))
    return sum(1 for n in range(body[0], body[1] + 1) if n not in skipped)


def kernel_budget(path: str):
    """(interior Counter summed over passes, masked Counter) of one kernel's bundle file: opcode counts and
    "bundles" per grid step (one elementwise op covers a vreg, 1,024 float32); the interior one also holds
    "steps" (grid steps per key block) and "every step" (every_step)."""
    lines = [line for line in open(path) if BUNDLE.match(line)]
    found, body = step_regions(lines)
    if len(found) % 2:
        raise SystemExit(f"{os.path.basename(path)}: {len(found)} block regions, expected masked/interior pairs")
    interior, masked = collections.Counter(), collections.Counter()
    for m, i in zip(found[0::2], found[1::2]):
        masked.update(m)
        interior.update(i)
    interior["every step"] = every_step(lines, body)
    interior["steps"] = len(found) // 2  # grid steps per key block: one a pass
    return interior, masked


def bundle_files(folder: str):
    """{kind: path} of the freeatten kernels' final bundles in a dump folder (fwd, dq, dkv)."""
    found = {}
    for path in glob.glob(os.path.join(folder, "*freeatten_*-final_bundles.txt")):
        name = re.search(r"freeatten_\w+?_(fwd|dq|dkv)\b", os.path.basename(path))
        if name and "schedule-analysis" not in path:
            found[name.group(1)] = path
    return found


def mxu_pushes(counter) -> int:
    """vmatmul issues on the busiest MXU."""
    per_mxu = collections.Counter()
    for op, n in counter.items():
        unit = re.search(r"\.mxu(\d)", op)
        if op.startswith("vmatmul") and unit:
            per_mxu[unit.group(1)] += n
    return max(per_mxu.values(), default=0)


def kernel_budgets(folder: str) -> dict:
    """{kind: (interior, masked)} (kernel_budget) of the fwd, dq and dkv kernels in a dump folder."""
    return {kind: kernel_budget(path) for kind, path in bundle_files(folder).items()}


def model_minimum(kind: str, generation: str, block_q: int, block_k: int, d: int) -> float:
    """The MXU-bound bundles of a block pair's model MACs (kind "fwd" or "bwd") on one generation."""
    return MODEL_MACS[kind] * d * block_q * block_k / MACS_PER_CYCLE[generation]


def kernel_row(name: str, budget, minimum: float | None):
    """(interior path bundles, markdown row) of one kernel (kernel_budget's pair), with its bound against `minimum`
    (None: no bound column)."""
    interior, masked = budget
    path = interior["bundles"] + interior["steps"] * interior["every step"]
    eup = " / ".join(f"{interior[op]:,}" for op in EUP)
    bound = "" if minimum is None else f"{minimum / path:.2f}"
    return path, (
        f"| {name} | {interior['bundles']:,} | {interior['steps']} x {interior['every step']:,} | "
        f"{masked['bundles']:,} | {mxu_pushes(interior)} | {eup} | {bound} |"
    )


def table_rows(variant: str, generation: str, budgets: dict, block_q: int, block_k: int, d: int):
    """Markdown rows for one variant's three kernels (kernel_budgets) and its backward: a key block's interior
    path is its interior regions plus, per grid step (one a pass), the bundles every step runs."""
    rows, path = [], {}
    minimum = {kind: model_minimum(kind, generation, block_q, block_k, d) for kind in MODEL_MACS}
    for kind in ("fwd", "dq", "dkv"):
        path[kind], row = kernel_row(f"{variant} {kind}", budgets[kind], minimum["fwd"] if kind == "fwd" else None)
        rows.append(row)
    backward = minimum["bwd"] / (path["dq"] + path["dkv"])
    rows.append(f"| {variant} backward (dq + dkv) | {path['dq'] + path['dkv']:,} | | | | | {backward:.2f} |")
    return rows


def _causal_steps(variant: str, t: int, block_q: int, block_k: int) -> dict:
    """{kind: (full grid steps, folded steps)} a (batch row, head) under a plain causal mask of T = t."""
    from freeatten_jax.attention.pallas import tpu_schedule
    from freeatten_jax.attention.rules import FAMILIES
    from freeatten_jax.attention.variants import VARIANTS

    passes, q_blocks, k_blocks = len(FAMILIES[VARIANTS[variant].normalise].passes), t // block_q, t // block_k
    steps = {}
    for kind, sweeps, key_major in (("fwd", passes, False), ("dq", 1, False), ("dkv", 1, True)):
        (outer, inner), blocks = (
            ((k_blocks, q_blocks), (block_k, block_q)) if key_major else ((q_blocks, k_blocks), (block_q, block_k))
        )
        plan = tpu_schedule.Schedule(outer, inner, sweeps, 1, tpu_schedule.Causal(t, *blocks, key_major))
        steps[kind] = (sweeps * outer * inner, plan.rows * plan.steps)
    return steps


def grid_steps_table(variants, block_q: int, block_k: int, lengths=(8192, 32768, 131072)) -> str:
    """Grid steps a (batch row, head) under a plain causal mask: every block pair (the full grid, which skips the
    invisible ones' work but not their steps) against the folded schedule (freeatten_jax.attention.pallas.tpu_schedule)."""
    lines = [
        f"\nGrid steps a (batch row, head; dK/dV: a kv head, times G), plain causal mask, blocks {block_q} x {block_k}: "
        "full grid -> folded schedule",
        "| variant | T | fwd | dq | dkv |",
        "|---|---|---|---|---|",
    ]
    for variant in variants:
        for t in lengths:
            cells = [f"{full:,} -> {folded:,}" for full, folded in _causal_steps(variant, t, block_q, block_k).values()]
            lines.append(f"| {variant} | {t // 1024}K | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def whole_kernel_rows(variant: str, budgets: dict, t: int, block: int):
    """Markdown rows of each kernel's static bundles a (batch row, head) under a causal mask of equal blocks, on the
    full grid and folded (budgets: {"folded": kernel_budgets, "full grid": kernel_budgets})."""
    blocks, rows = t // block, []
    pairs = blocks * (blocks - 1) // 2  # interior: wholly below the diagonal
    for kind, (full_steps, folded_steps) in _causal_steps(variant, t, block, block).items():
        total = {}
        for grid, steps in (("full grid", full_steps), ("folded", folded_steps)):
            interior, masked = budgets[grid][kind]
            total[grid] = pairs * interior["bundles"] + blocks * masked["bundles"] + steps * interior["every step"]
        rows.append(
            f"| {variant} {kind}, whole kernel | {full_steps:,} | {total['full grid']:,} | {folded_steps:,} | "
            f"{total['folded']:,} | {total['folded'] / total['full grid']:.3f} |"
        )
    return rows
