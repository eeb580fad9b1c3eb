"""Compile without the chips and report what would not fit: `compile_attention` and `compile_train_step`.

Glossary: B batch, T length, H heads, D head dim. Each returns a Report of one device's memory (XLA's
memory_analysis: arguments, outputs, temporaries; peak against the chip's HBM) and the number of
kernels (Pallas custom calls) in the compiled program. A compile that fails for lack of VMEM, shared
memory or HBM raises DoesNotFit with one line naming the overflow and the knob to turn.
"""

import math
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from freeatten_jax.compile import targets
from freeatten_jax.errors import UserError

GIB = 2**30
_COMPILER_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)([KMGT])(?:iB)?(?!\w)")  # "95.74G", "85.00GiB": binary units
_KERNEL_CALLS = re.compile(r'custom_call_target="(tpu_custom_call|__gpu\$xla\.gpu\.triton)"')
_COLLECTIVE = re.compile(r"\s(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")
_GROUPS = re.compile(r"(?:replica_groups|source_target_pairs)=(\{[{}\d,]*\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)")
_DCN = re.compile(r'MegascaleRendezvousKeyName="([^"]+)"')
_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_OPERANDS = re.compile(r"operand_layout_constraints=\{((?:\w+\[[\d,]*\](?:\{[\d,]*\})?(?:, )?)*)\}")


class DoesNotFit(UserError):
    """The program does not fit the target: the message names the overflow and the knob."""


class Report(NamedTuple):
    target: str
    arguments: int  # bytes per device
    outputs: int
    temporaries: int
    peak: int  # arguments + outputs - aliased + temporaries
    hbm: int
    kernels: int
    kernel_operands: tuple  # per kernel call, its operands' shapes: what one device's kernel sees
    rotations: tuple[int, list[str]] = (0, [])  # the ring steps' collective-permutes: exposed_permutes

    def lines(self) -> list[str]:
        gib = lambda x: f"{x / GIB:.2f} GiB"  # noqa: E731
        return [
            f"target {self.target}: per device, arguments {gib(self.arguments)}, outputs {gib(self.outputs)}, "
            f"temporaries {gib(self.temporaries)}",
            f"peak {gib(self.peak)} of {gib(self.hbm)} HBM ({100 * self.peak / self.hbm:.0f}%); {self.kernels} Pallas kernel calls"  # noqa: E501
            + (f", largest operand {max(sum(self.kernel_operands, ()), key=math.prod)}" if any(self.kernel_operands) else "")
            + (f"; ring rotations {self.rotations[0]}, {len(self.rotations[1])} overlapping no kernel" * bool(self.rotations[0])),
        ]


STEP_HBM_KNOB = "lower train.batch_size (or raise train.grad_accum_steps), turn on model.remat, or shard over more devices"
ATTENTION_HBM_KNOB = "shorten --seq_len or lower --heads (a training step shards heads over the mesh's tensor axis)"
_OVERFLOWS = [  # (pattern in the compiler's message, what overflowed, the knob; None: the caller's HBM knob)
    (r"vmem|Scoped allocation", "TPU VMEM", "lower implementation_options block_q / block_k"),
    (r"[Ss]hared memory size limit", "GPU shared memory per block", "lower implementation_options block_q / block_k"),
    (r"HBM|RESOURCE_EXHAUSTED.*memory|[Oo]ut of memory", "device HBM", None),
]


def kernel_operands(hlo: str) -> tuple:
    """The operand shapes of each Pallas kernel call in compiled HLO text (empty where the call lists none)."""
    calls = [line for line in hlo.splitlines() if _KERNEL_CALLS.search(line)]
    operands = [_OPERANDS.search(line) for line in calls]
    return tuple(
        tuple(tuple(int(n) for n in dims.split(",") if n) for dims in re.findall(r"\w+\[([\d,]*)\]", m.group(1))) if m else ()
        for m in operands
    )


def exposed_permutes(hlo: str) -> tuple[int, list[str]]:
    """In compiled HLO text, over the computations that call a Pallas kernel (the ring's steps): (how many of the
    ring's rotations they start, the names of those whose start..done span encloses no kernel call: a rotation that
    the step waits for instead of overlapping it with the kernels). Instructions are listed in schedule order; other
    permutes (the zig-zag layout's) are not counted."""
    count, exposed = 0, []
    for computation in re.split(r"\n(?=\S)", hlo):
        if not _KERNEL_CALLS.search(computation):
            continue
        open_, kernels = {}, 0
        for line in computation.splitlines():
            if _KERNEL_CALLS.search(line):
                kernels += 1
            elif (start := re.match(r"\s*%(\S+) = .* collective-permute-start\(", line)) and _rotation(line):
                open_[start.group(1)], count = kernels, count + 1
            elif (done := re.search(r" collective-permute-done\(%(\S+?)\)", line)) and done.group(1) in open_:
                if open_.pop(done.group(1)) == kernels:
                    exposed.append(done.group(1))
    return count, exposed


def _rotation(line: str) -> bool:
    """Whether a collective-permute rotates each group of consecutive devices by one (ring_mask.rotate: d -> d + 1,
    the last to the first), as the ring does and the zig-zag layout's permutes do not (compiled TPU programs keep no
    op names to tell them apart)."""
    step = dict(_device_groups(_GROUPS.search(line).group(1), 0))
    unvisited = set(step)
    while unvisited:
        cycle = [min(unvisited)]
        while step.get(cycle[-1]) == cycle[-1] + 1:
            cycle.append(cycle[-1] + 1)
        if len(cycle) < 2 or step.get(cycle[-1]) != cycle[0]:
            return False
        unvisited -= set(cycle)
    return True


def collectives(hlo: str, devices: int) -> list[tuple[str, list[list[int]]]]:
    """Every collective of compiled HLO text: (its op, the groups of devices it joins: a permute's source/target pairs,
    a reduction's replica groups, as positions in the compiled mesh's device order; no groups = all `devices`)."""
    found = []
    for line in hlo.splitlines():
        if op := _COLLECTIVE.search(line):
            groups = _GROUPS.search(line)
            found.append((op.group(1), _device_groups(groups.group(1) if groups else "{}", devices)))
    return found


def dcn_collectives(hlo: str) -> set[str]:
    """The collectives a multi-slice TPU program sends between slices (over DCN, by the megascale runtime: each is
    named after the collective it stands for, e.g. `all-reduce.36_0`)."""
    return set(_DCN.findall(hlo))


def _device_groups(text: str, devices: int) -> list[list[int]]:
    """`{{0,1},{2,3}}` or the iota form `[2,4]<=[4,2]T(1,0)` (arange(8) shaped [4,2], transposed, reshaped [2,4])."""
    ints = lambda s: [int(n) for n in s.split(",")]  # noqa: E731
    if iota := _IOTA.fullmatch(text):
        ids = np.arange(math.prod(ints(iota[2]))).reshape(ints(iota[2]))
        return ids.transpose(ints(iota[3]) if iota[3] else None).reshape(ints(iota[1])).tolist()
    return [ints(group) for group in re.findall(r"\{([\d,]+)\}", text)] or [list(range(devices))]


def explain(error: Exception, target: str, hbm_knob: str = STEP_HBM_KNOB) -> Exception:
    """A DoesNotFit with one line for a memory overflow; the error itself otherwise."""
    text = str(error)
    for pattern, what, knob in _OVERFLOWS:
        knob = knob or hbm_knob
        if re.search(pattern, text):
            detail = next(
                (line.strip() for line in text.splitlines() if re.search(r"Used|exceed|limit", line)), text.splitlines()[0]
            )
            detail = _COMPILER_SIZE.sub(r"\1 \2iB", detail)  # the compilers' units written as the Report writes them
            return DoesNotFit(f"{target}: {what} overflow ({detail[:200]}): {knob}")
    return error


def compile_report(lower, target: str, hbm_knob: str = STEP_HBM_KNOB) -> Report:
    """The Report of compiling `lower()`'s program (a zero-argument function returning a jax Lowered)."""
    try:
        compiled = lower().compile()
    except Exception as e:  # the compiler's own error types differ per backend
        raise explain(e, target, hbm_knob) from e
    memory = compiled.memory_analysis()
    peak = memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes + memory.temp_size_in_bytes
    text = compiled.as_text()
    operands = kernel_operands(text)
    report = Report(
        target,
        memory.argument_size_in_bytes,
        memory.output_size_in_bytes,
        memory.temp_size_in_bytes,
        peak,
        targets.parse(target).hbm_bytes,
        len(operands),
        operands,
        exposed_permutes(text),
    )
    if report.peak > report.hbm:
        raise DoesNotFit(f"{target}: device HBM overflow (peak {peak / GIB:.2f} GiB of {report.hbm / GIB:.2f} GiB): {hbm_knob}")
    return report


def compile_attention(
    target: str,
    *,
    variant: str,
    seq_len: int,
    batch: int = 1,
    heads: int = 16,
    head_dim: int = 128,
    implementation: str = "pallas",
    dtype=jnp.bfloat16,
    gradients: bool = True,
    **options,
) -> Report:
    """attend's forward+backward (the vjp of q, k, v) on one device of the target; the forward alone (inference)
    without `gradients`."""
    from freeatten_jax import attention

    mesh = jax.sharding.Mesh(targets.devices(target)[:1], ("device",))
    shape = jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), dtype, sharding=NamedSharding(mesh, PartitionSpec()))

    def loss(q, k, v):
        out = attention.attend(q, k, v, variant=variant, implementation=implementation, **options)
        return jnp.sum(out.astype(jnp.float32))

    def lower():
        with jax.set_mesh(mesh):
            return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)) if gradients else loss).lower(shape, shape, shape)

    return compile_report(lower, target, ATTENTION_HBM_KNOB)


def lower_train_step(cfg, devices) -> jax.stages.Lowered:
    """Training's own step (training.step.make_train_step) of a typed config on a mesh of `devices`, lowered on
    abstract inputs: the state in its shardings and a [batch_size, seq_len + 1] batch."""
    from freeatten_jax.nn import sharding
    from freeatten_jax.training import optim
    from freeatten_jax.training import state as train_state
    from freeatten_jax.training import step as train_step

    mesh = sharding.make_mesh(cfg.mesh.shape, list(devices), cfg.mesh.slices)
    abstract, shardings = train_state.abstract_state(cfg, mesh, optim.make(cfg.optim, cfg.train.steps))
    tokens = (cfg.train.batch_size, cfg.train.seq_len + 1)
    batch = jax.ShapeDtypeStruct(tokens, jnp.int32, sharding=sharding.batch_sharding(mesh, cfg.mesh.rules, tokens))
    step = train_step.make_train_step(cfg, shardings)
    with sharding.use_mesh(mesh, cfg.mesh.rules):
        return step.lower(abstract, batch)


def compile_train_step(cfg_dict, target: str) -> Report:
    """One optimiser step of a training config (`freeatten-train`'s step: its mesh, shardings and batch); reads no data."""
    from freeatten_jax.training import config

    cfg = config.parse(cfg_dict, reads_data=False)
    return compile_report(lambda: lower_train_step(cfg, targets.devices(target)), target)
