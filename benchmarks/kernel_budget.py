"""Per-score instruction budget of the Pallas kernels, compiled for H100 (sm_90a) or a TPU without the chip.

    python benchmarks/kernel_budget.py [--target h100|v5e|v5p|v6e] [--variants softmax,lssa,lssar,sigmoid] [--seq_len 8192]
                                       [--head_dim 128] [--kernels triton,mosaic_gpu] [--mosaic_shapes 8192x128,8192x64]

TPU targets: the VLIW bundles of each kernel's grid step (benchmarks/tpu_bundles.py), D = --head_dim (below 128 the
kernels read and write their [.., L, D] arrays packed: what unpacking costs a grid step shows here). H100:

Compiles attend's forward+backward (implementation="pallas", bf16, B=1, H=2, D=128, causal) for an
H100 target through the CUDA PJRT plugin (`pip install '.[compile]'`), with XLA's dump on, so each
Triton kernel's PTX lands in a temporary folder. Then per kernel: `ptxas -arch=sm_90a -v` (registers,
spills), `cuobjdump -sass`, and the inner loops (the SASS's backward branches) counted by instruction
class per score: one loop iteration covers block_q x block_k scores, and each of the CTA's warps runs
the loop body once. The bound divides the tensor-core time of the scores' model FLOP (4·D a forward
score, 10·D a backward one, FlashAttention-2's count) by the time of the busiest resource at H100's
per-SM rates per clock: 4,096 tensor FLOP, 16 MUFU, 128 FP32, 64 other ALU, 128 issued instructions.
It is a static upper bound (1.0 = could be tensor-bound), not a measured speed. The ceiling is the bound if
only the tensor cores counted: model FLOP over the kernel's own tensor FLOP (the split matmuls add to the latter).

The Mosaic GPU forward (LSSA, gpu_kernels="mosaic_gpu") at each of --mosaic_shapes (T x D): its MOSAIC_GPU_DUMP_TO
dump gives the ptxas log (registers, spill bytes) and the PTX, re-assembled for the SASS; the loops counted are
those holding HGMMA (the mask-free run, then the masked blocks), per score with the classes above, each body's
scores being its HGMMA FLOP over 4·D.
"""

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import tpu_bundles

RATES = {"tensor": 4096, "mufu": 16, "fp32": 128, "alu": 64, "issue": 128}  # per SM per clock (H100 SXM)
MODEL_FLOP = {"fwd": 4, "backward": 10}  # tensor FLOP per score, in units of D
FP32 = ("FFMA", "FMUL", "FADD")
ALU = (
    "IADD",
    "IMAD",
    "IMUL",
    "ISETP",
    "FSETP",
    "FSEL",
    "SEL",
    "LOP",
    "SHF",
    "SHL",
    "SHR",
    "LEA",
    "PRMT",
    "F2F",
    "F2I",
    "I2F",
    "FMNMX",
    "IMNMX",
    "VIMNMX",
    "MOV",
    "P2R",
    "R2P",
    "PLOP3",
    "IABS",
    "FCHK",
    "FRND",
    "FSWZADD",
    "POPC",
    "FLO",
    "BREV",
    "BMSK",
    "CS2R",
)
H100 = """gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152 shared_memory_per_core: 233472
  threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128 block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535 block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84942979072 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 feature_extension: ACCELERATED_FEATURES }
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


def cuda_tool(name: str) -> str:
    """A CUDA binary: on PATH, else from the nvidia-* wheels (nvidia-cuda-nvcc, -cuobjdump, -nvdisasm)."""
    found = shutil.which(name)
    if found:
        return found
    import nvidia

    for root in nvidia.__path__:
        for path in glob.glob(os.path.join(root, "*", "bin", name)):
            return path
    sys.exit(f"{name} not found: install '.[compile]' (the nvidia-cuda-* wheels) or a CUDA toolkit")


def compile_kernels(
    variant: str, seq_len: int, gradients: bool = True, block_k_dkv=None, head_dim: int = 128, gpu_kernels="triton"
) -> None:
    """Compile attend's forward+backward (the forward alone without `gradients`) for one H100, the dumps going where
    main() pointed XLA's and Mosaic GPU's; block_k_dkv: the dK/dV kernel's key block (None: the key block)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies

    from freeatten_jax import attention

    topology = topologies.get_topology_desc(platform="cuda", topology_name="", topology="1x1x1", target_config=H100)
    mesh = jax.sharding.Mesh(topology.devices[:1], ("device",))
    shape = jax.ShapeDtypeStruct(
        (1, seq_len, 2, head_dim), jnp.bfloat16, sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    )

    def loss(q, k, v):
        out = attention.attend(
            q, k, v, variant=variant, implementation="pallas", block_k_dkv=block_k_dkv, gpu_kernels=gpu_kernels
        )
        return jnp.sum(out.astype(jnp.float32))

    with jax.set_mesh(mesh):
        jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)) if gradients else loss).lower(shape, shape, shape).compile()


def ptxas_counts(log: str):
    """(registers, spill bytes stored + loaded) from a `ptxas -v` log."""
    used = re.search(r"Used (\d+) registers", log)
    assert used, log
    return int(used.group(1)), sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))


def ptxas(ptx: str, cubin: str):
    """(registers, spill bytes stored + loaded) from `ptxas -v`, writing the cubin."""
    out = subprocess.run(
        [cuda_tool("ptxas"), "-arch=sm_90a", "-v", ptx, "-o", cubin], capture_output=True, text=True, check=True
    ).stderr
    return ptxas_counts(out)


def loops(cubin: str):
    """The instruction names of each inner loop: the SASS from a backward branch's target to the branch."""
    env = dict(os.environ, PATH=os.path.dirname(cuda_tool("nvdisasm")) + os.pathsep + os.environ["PATH"])
    sass = subprocess.run([cuda_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True, env=env).stdout
    code = [(int(a, 16), text.strip()) for a, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    found = []
    for address, text in code:
        branch = re.search(r"\bBRA\s+(?:\S+\s+)?0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            start = int(branch.group(1), 16)
            found.append([t for a, t in code if start <= a <= address])
    return found


def mnemonic(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def mma_flop(name: str) -> int:
    """Tensor FLOP of one warp's share of an MMA instruction (HGMMA is per warpgroup of 4 warps)."""
    shape = re.search(r"(\d+)x(\d+)x(\d+)", name)
    if name.startswith("HGMMA") and shape:
        m, n, k = (int(x) for x in shape.groups())
        return 2 * m * n * k // 4
    if name.startswith("HMMA"):
        digits = re.search(r"HMMA\.(\d\d)(\d)(\d\d)", name)
        m, n, k = (int(x) for x in digits.groups()) if digits else (16, 8, 16)
        return 2 * m * n * k
    return 0


def classify(body):
    """Per-iteration counts by class, and the tensor FLOP, of one warp's loop body."""
    counts, flop = collections.Counter(), 0
    for text in body:
        name = mnemonic(text)
        counts["all"] += 1
        if "MMA" in name:
            counts["tensor"] += 1
            flop += mma_flop(name)
        elif name.startswith("MUFU"):
            counts["mufu"] += 1
        elif name.startswith(FP32):
            counts["fp32"] += 1
        elif name.startswith(ALU):
            counts["alu"] += 1
    return counts, flop


def budget(cubin: str, block_q: int, block_k: int, warps: int):
    """{"interior", "edge"}: per-score counts by class and tensor FLOP per score, summed over the kernel's
    sweeps. Each sweep compiles to three loops in code order (gpu.sweep_spans): masked edge
    blocks, the mask-free interior run, masked edge blocks; a kernel whose loops do not come in threes
    is reported whole, as "all". "spill" counts local-memory loads and stores (LDL, STL) per iteration."""
    found = loops(cubin)
    parts = {"interior": found[1::3], "edge": found[0::3]} if len(found) % 3 == 0 else {"all": found}
    result = {}
    for part, bodies in parts.items():
        per_score, flop = collections.Counter(), 0.0
        for body in bodies:
            counts, body_flop = classify(body)
            for name, count in counts.items():
                per_score[name] += count * warps * 32 / (block_q * block_k)
            per_score["spill"] += sum(mnemonic(t).startswith(("LDL", "STL")) for t in body)
            flop += body_flop * warps / (block_q * block_k)
        result[part] = (per_score, flop)
    return result


def clocks(per_score, flop) -> float:
    """Clocks per score on one SM: the busiest resource."""
    return max(
        flop / RATES["tensor"],
        per_score["mufu"] / RATES["mufu"],
        per_score["fp32"] / RATES["fp32"],
        per_score["alu"] / RATES["alu"],
        per_score["all"] / RATES["issue"],
    )


def gpu_table(args, dump: str) -> None:
    """The H100 table: per kernel and sweep part, per-score counts by class and the bound."""
    from freeatten_jax import attention
    from freeatten_jax.attention.pallas import core, gpu

    d = 128
    print(
        f"H100 sm_90a, T={args.seq_len}, D={d}, bf16, causal, each family's default blocks (gpu.GPU_BLOCKS; dK/dV's "
        f"key block {args.block_k_dkv or 'the key block'}), {gpu.TRITON_WARPS} warps; per score, the kernel's sweeps "
        "summed; interior = mask-free blocks, edge = masked ones"
    )
    print(
        "| kernel | tensor FLOP | MUFU | FP32 | other ALU | all | spill ld/st per iteration | registers, spill bytes | bound "
        "| ceiling |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for variant in args.variants.split(","):
        times, flops = collections.defaultdict(dict), collections.defaultdict(dict)
        block_q, block_k = core.LOWERINGS["cuda"].blocks(attention.get_variant(variant).normalise)
        for gradients in (True, False):  # training's kernels, then inference's forward (rules.output_only)
            before = set(glob.glob(os.path.join(dump, "*.ptx")))
            compile_kernels(variant, args.seq_len, gradients, args.block_k_dkv)
            seen = set()
            for ptx in sorted(set(glob.glob(os.path.join(dump, "*.ptx"))) - before):
                entry = re.search(r"\.entry\s+(freeatten_\w+)\(", open(ptx).read())
                if not entry or entry.group(1) in seen:
                    continue
                seen.add(entry.group(1))
                kind = entry.group(1).rsplit("_", 1)[1]
                name = f"{variant} {kind}" if gradients else f"{variant} {kind}, no gradient"
                registers, spills = ptxas(ptx, ptx + ".cubin")
                warps = int(re.search(r"\.reqntid\s+(\d+)", open(ptx).read()).group(1)) // 32  # the kernel's own
                keys = args.block_k_dkv or block_k if kind == "dkv" else block_k  # a loop iteration's keys
                for part, (per_score, flop) in budget(ptx + ".cubin", block_q, keys, warps).items():
                    time = clocks(per_score, flop)
                    if gradients:
                        times[part][kind], flops[part][kind] = time, flop
                    model = MODEL_FLOP["fwd"] * d if kind == "fwd" else flop
                    row = (
                        [f"{flop:.0f}"]
                        + [f"{per_score[c]:.1f}" for c in ("mufu", "fp32", "alu", "all")]
                        + [f"{per_score['spill']:.0f}"]
                    )
                    ceiling = f"{model / flop:.2f}" if kind == "fwd" else ""
                    print(
                        f"| {name} {part} | {' | '.join(row)} | {registers}, {spills} | {model / RATES['tensor'] / time:.2f} "
                        f"| {ceiling} |",
                        flush=True,
                    )
        for part, kinds in times.items():
            model, names = MODEL_FLOP["backward"] * d, [kind for kind in ("dq", "dkv") if kind in kinds]
            backward = model / RATES["tensor"] / sum(kinds[kind] for kind in names)
            ceiling = model / sum(flops[part][kind] for kind in names)
            print(
                f"| {variant} backward {part} ({' + '.join(names)} at 10·D per score) | | | | | | | | {backward:.2f} "
                f"| {ceiling:.2f} |",
                flush=True,
            )


def mosaic_loops(cubin: str):
    """The loops holding HGMMA, in code order; a branch back from past the kernel's EXIT (a barrier wait's
    out-of-line retry) spans no loop and is dropped."""
    bodies = [body for body in loops(cubin) if not any(mnemonic(t) == "EXIT" for t in body)]
    return [body for body in bodies if any(mnemonic(t).startswith("HGMMA") for t in body)]


def mosaic_budget(dump: str, d: int, rows: int, keys: int):
    """(registers, spill bytes) from the ptxas log of the one Mosaic GPU kernel in `dump`, and {part: (per-score
    counts by class, tensor FLOP per score)}: part "interior" then "edge" (mosaic_gpu's two key loops), each body's
    counts per score over its HGMMA FLOP / 4·D scores, its FLOP over a warpgroup's rows x keys."""
    (log,) = glob.glob(os.path.join(dump, "*.ptxas"))
    registers, spills = ptxas_counts(open(log).read())
    (ptx,) = glob.glob(os.path.join(dump, "*.ptx"))
    ptxas(ptx, ptx + ".cubin")
    found = mosaic_loops(ptx + ".cubin")
    names = ("interior", "edge") if len(found) == 2 else [f"loop {i}" for i in range(len(found))]
    parts = {}
    for name, body in zip(names, found):
        counts, flop = classify(body)
        scores = flop * 4 / (MODEL_FLOP["fwd"] * d)  # one warp's share of its warpgroup's HGMMA FLOP
        per_score = collections.Counter({k: v * 4 * 32 / scores for k, v in counts.items()})
        per_score["spill"] = sum(mnemonic(t).startswith(("LDL", "STL")) for t in body)
        parts[name] = (per_score, flop * 4 / (rows * keys))
    return registers, spills, parts


def mosaic_table(args, dump: str) -> None:
    """The Mosaic GPU forward's table: LSSA's forward at each T x D, the columns of the Triton table; compiled without
    a gradient (half the compile time: its key loops are the training forward's, which only stores more after them)."""
    from freeatten_jax.attention.pallas import mosaic_gpu

    rows, keys = mosaic_gpu.blocks("sum")
    print(
        f"Mosaic GPU forward (H100): sm_90a, LSSA, bf16, causal, blocks {rows} x {keys} a consumer warpgroup, "
        "gpu_kernels='mosaic_gpu', per score of the HGMMA loops (interior = mask-free blocks, edge = masked ones)"
    )
    print(
        "| kernel | tensor FLOP | MUFU | FP32 | other ALU | all | spill ld/st per iteration | registers, spill bytes | bound "
        "| ceiling |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.mosaic_shapes.split(","):
        t, d = (int(x) for x in shape.split("x"))
        for path in glob.glob(os.path.join(dump, "*")):
            os.remove(path)
        compile_kernels("lssa", t, False, head_dim=d, gpu_kernels="mosaic_gpu")
        registers, spills, parts = mosaic_budget(dump, d, rows, keys)
        model = MODEL_FLOP["fwd"] * d
        for part, (per_score, flop) in parts.items():
            row = [f"{flop:.0f}"] + [f"{per_score[c]:.2f}" for c in ("mufu", "fp32", "alu", "all")]
            bound = model / RATES["tensor"] / clocks(per_score, model)
            print(
                f"| lssa fwd mosaic_gpu T={t} D={d} {part} | {' | '.join(row)} | {per_score['spill']:.0f} "
                f"| {registers}, {spills} | {bound:.2f} | {model / flop:.2f} |",
                flush=True,
            )


def tpu_table(args, dump: str) -> None:
    """The TPU table: per kernel, the interior grid step's bundles (and the masked one's), MXU pushes, EUP ops
    per score and the bound (tpu_bundles)."""
    import jax

    from freeatten_jax.attention.pallas import tpu as pallas_tpu
    from freeatten_jax.compile import compile_attention, targets

    topology, d = tpu_bundles.TOPOLOGY[args.target], args.head_dim
    with jax.set_mesh(jax.sharding.Mesh(targets.devices(topology)[:1], ("device",))):
        block_q, block_k = pallas_tpu.tuning().blocks
    print(
        f"TPU {args.target}, T={args.seq_len}, D={d}, bf16, causal, blocks {block_q}x{block_k}; per key block on the "
        f"interior (mask-free) path, passes summed; bound = model MACs / {tpu_bundles.MACS_PER_CYCLE[args.target]:,} "
        "per cycle / bundles (one bundle a cycle)"
    )
    print(
        "| kernel | interior bundles | steps x every-step bundles | masked bundles | vmatmul per MXU "
        "| EUP ops (pow2 / log2 / rcp; one a vreg) | bound |"
    )
    print("|---|---|---|---|---|---|---|")

    def compiled(variant, **options):
        """Compile one variant and read its kernels' budgets from the dump, then empty it (~500 MB a compile)."""
        compile_attention(topology, variant=variant, seq_len=args.seq_len, heads=1, head_dim=d, **options)
        try:
            return tpu_bundles.kernel_budgets(dump)
        finally:
            for path in glob.glob(os.path.join(dump, "*")):
                os.remove(path)

    whole = []
    minimum = tpu_bundles.model_minimum("fwd", args.target, block_q, block_k, d)
    for variant in args.variants.split(","):
        budgets = compiled(variant)
        for row in tpu_bundles.table_rows(variant, args.target, budgets, block_q, block_k, d):
            print(row, flush=True)
        inference = compiled(variant, gradients=False)["fwd"]  # the output's passes alone (rules.output_only)
        print(tpu_bundles.kernel_row(f"{variant} fwd, no gradient", inference, minimum)[1], flush=True)
        if args.full_grid:  # the same kernels on the full grid: segment ids given (all one) make the mask not plain
            full = compiled(variant, q_segment_ids=jax.numpy.zeros((1, args.seq_len), jax.numpy.int32))
            whole += tpu_bundles.whole_kernel_rows(variant, {"folded": budgets, "full grid": full}, args.seq_len, block_q)
    print(tpu_bundles.grid_steps_table(args.variants.split(","), block_q, block_k))
    if whole:
        print(
            f"\nStatic bundles a (batch row, head), T={args.seq_len}, causal, equal blocks: interior pairs x interior "
            "bundles + diagonal pairs x masked bundles + grid steps x every-step bundles (what a grid step costs "
            "beyond its bundles is not in it)"
        )
        print("| kernel | full grid: steps | bundles | folded: steps | bundles | folded / full |")
        print("|---|---|---|---|---|---|")
        print("\n".join(whole))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="h100", choices=["h100", *tpu_bundles.TOPOLOGY])
    parser.add_argument("--variants", default="softmax,lssa,lssar,sigmoid")
    parser.add_argument("--seq_len", type=int, default=8192)
    parser.add_argument("--block_k_dkv", type=int, help="H100: the dK/dV kernel's key block (default: the key block)")
    parser.add_argument("--head_dim", type=int, default=128, help="TPU: D (below 128 the kernels read rows packed)")
    parser.add_argument(
        "--full_grid", action="store_true", help="TPU: also compile on the full grid and compare whole-kernel bundles"
    )
    parser.add_argument("--kernels", default="triton,mosaic_gpu", help="H100: the tables, of triton and mosaic_gpu")
    parser.add_argument("--mosaic_shapes", default="8192x128,8192x64", help="H100: the Mosaic GPU forward's T x D")
    args = parser.parse_args(argv)
    dump = tempfile.mkdtemp(prefix="kernel_budget_")
    mosaic_dump = os.path.join(dump, "mosaic_gpu")
    if args.target == "h100":
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump} --xla_dump_hlo_as_text"
        os.makedirs(mosaic_dump)
        os.environ["MOSAIC_GPU_DUMP_TO"] = mosaic_dump  # read by each Mosaic GPU compile
    else:  # read once, when libtpu loads
        os.environ["LIBTPU_INIT_ARGS"] = f"{os.environ.get('LIBTPU_INIT_ARGS', '')} {tpu_bundles.dump_flags(dump)}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the CUDA plugin compiles through its topology; no GPU is opened
    if args.target != "h100":
        tpu_table(args, dump)
    else:
        kernels = args.kernels.split(",")
        if "triton" in kernels:
            gpu_table(args, dump)
        if "mosaic_gpu" in kernels:
            mosaic_table(args, mosaic_dump)
    shutil.rmtree(dump)


if __name__ == "__main__":
    main()
