"""The curated mutants of scripts/mutation_check.py, grouped by the module they break.

Each is a deliberate one-line bug: (name, file, exact original snippet, replacement, pytest arguments that must
fail on it). One list here rather than files beside the code: freeatten_jax/attention/ is a leaf package and the
library ships no test data; one place shows the whole catalogue. Add a mutant whenever a bug is found that
the tests missed. Test paths not on this branch yet are skipped by the script (and named in its output).
"""

import pathlib
from typing import NamedTuple


class Mutant(NamedTuple):
    name: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]  # pytest arguments: paths / node ids, optionally "-k", expression


def misplaced(mutants, root: pathlib.Path) -> list[str]:
    """One line for each mutant whose snippet is not in its file exactly once (tests/test_mutants.py keeps it empty)."""
    counts = [(m, (root / m.file).read_text().count(m.original)) for m in mutants]
    return [
        f"mutant {m.name!r}: its original snippet occurs {n} times in {m.file} (must be once); update scripts/mutants.py"
        for m, n in counts
        if n != 1
    ]


VARIANTS_PY = "freeatten_jax/attention/variants.py"


def oracle(variant: str) -> tuple[str, ...]:
    """The values-vs-oracle tests of one variant (ids are "[variant-scenario]")."""
    return ("tests/test_attention.py::test_values_match_oracle", "-k", f"[{variant}-")


BLOCK_EDGES = ("tests/test_block_edges.py",)
NARROW_HEADS = "tests/test_pallas.py", "tests/test_context_parallel.py"
HF_LLAMA_PY = "freeatten_jax/formats/hf_llama.py"
HF_IMPORT = "tests/test_hf_import.py"
ROPE_READINGS = f"{HF_IMPORT}::test_config_jsons_rope_is_read_as_transformers_5_reads_it"
BROKEN_HUB = f"{HF_IMPORT}::test_an_unsupported_or_broken_folder_is_one_error_line_and_writes_nothing"
ROPE_PY = "freeatten_jax/nn/rope.py"
ROPE_FREQUENCIES = "tests/test_attention_layer.py::test_rope_frequencies_follow_hugging_faces_definitions"
SWITCHES = "tests/test_eval_metrics.py::test_each_switch_gives_the_model_it_names"
EVAL = "tests/test_eval_metrics.py"
FAULTS = "tests/test_faults.py"
RESUME = "tests/test_eval_resume.py"
ROLLBACK_PY = "freeatten_jax/training/rollback.py"


def rollback_test(name: str) -> tuple[str, ...]:
    """One test of tests/training/test_rollback.py (rollback.py's rules, called directly)."""
    return (f"tests/training/test_rollback.py::{name}",)


RULES_PY = "freeatten_jax/attention/rules.py"
BLOCK_PLAN_PY = "freeatten_jax/attention/block_plan.py"
SKIPPING = ("blockwise", "pallas and not tpu", "pallas_tpu_kernels", "context_parallel")  # test_block_edges' implementations
IMPLEMENTATIONS = {  # name: the values-and-gradients-vs-reference tests of that implementation ("-k" narrows to a variant)
    "blockwise": ("tests/test_blockwise.py::test_blockwise_matches_reference",),
    "pallas GPU kernels": ("tests/test_pallas.py::test_pallas_matches_reference", "-k", "gpu and "),
    "pallas TPU kernels": ("tests/test_pallas.py::test_pallas_matches_reference", "-k", "tpu and "),
    "ring": ("tests/test_context_parallel.py::test_matches_reference",),
}
P_PATHS = ("blockwise", "pallas", "pallas_tpu_kernels", "context_parallel", "kernel_ring")  # test_pallas's dL/dp test ids


def every_implementation(name: str, original: str, replacement: str, variant: str) -> list[Mutant]:
    """One mutant of rules.py per implementation, each caught only by that implementation's tests of `variant`."""

    def tests(args):
        return (*args[:2], args[2] + variant) if len(args) == 3 else (*args, "-k", variant)

    return [Mutant(f"{name} [{impl}]", RULES_PY, original, replacement, tests(args)) for impl, args in IMPLEMENTATIONS.items()]


def every_p_path(name: str, original: str, replacement: str) -> list[Mutant]:
    """One mutant of rules.py per path that differentiates LSSAR's p, each caught by that path's dL/dp test."""
    return [
        Mutant(
            f"{name} [{path}]",
            RULES_PY,
            original,
            replacement,
            (f"tests/test_pallas.py::test_lssar_power_gradient_matches_finite_differences[{path}]",),
        )
        for path in P_PATHS
    ]


def every_skipping(name: str, original: str, replacement: str) -> list[Mutant]:
    """One mutant of block_plan.py per implementation that skips blocks, each caught by that one's block-edge tests."""
    return [
        Mutant(f"{name} [{impl.split()[0]}]", BLOCK_PLAN_PY, original, replacement, (*BLOCK_EDGES, "-k", impl))
        for impl in SKIPPING
    ]


MUTANTS = [
    Mutant(
        "data.mqar.competing: dilute's competing pairs may take the instance's keys (one can answer a query)",
        "freeatten_jax/data/mqar.py",
        "free_F = np.setdiff1d(np.arange(task.num_keys), instance.keys_P)",
        "free_F = np.arange(task.num_keys)",
        ("tests/test_mqar.py", "-k", "dilute"),
    ),
    Mutant(
        "data.mqar.competing: dilute holds a fixed 4 competing pairs at every length (no growth with length)",
        "freeatten_jax/data/mqar.py",
        "count = task.pairs * prefix // instance.train_len",
        "count = task.pairs * bool(prefix)",
        ("tests/test_mqar.py", "-k", "dilute"),
    ),
    Mutant(
        "suite.measure: eval-time switches skipped on MQAR runs (rope_theta=50x scores the checkpoint as trained)",
        "freeatten_jax/evaluation/suite.py",
        "    switches.apply(model, cfg, switch)\n",
        '    switches.apply(model, cfg, switch) if cfg.data.source != "mqar" else None\n',
        ("tests/test_mqar_training.py", "-k", "rope_theta"),
    ),
    Mutant(
        "together.block: a block's parameter gradients free to be postponed (no barrier with its input's)",
        "freeatten_jax/nn/together.py",
        "lambda _, g: jax.lax.optimization_barrier(g))",
        "lambda _, g: g)",
        ("tests/test_model.py", "-k", "projections_and_blocks"),
    ),
    Mutant(
        "dense: the weight gradient free to be postponed (no barrier with the input's)",
        "freeatten_jax/nn/together.py",
        "return jax.lax.optimization_barrier(vjp(g))",
        "return vjp(g)",
        ("tests/test_model.py", "-k", "projections_and_blocks"),
    ),
    Mutant(
        "mesh.slices: each slice's chips interleaved along 'context' (the ring crosses slices)",
        "freeatten_jax/nn/sharding.py",
        "grid = np.concatenate([mesh_utils.create_device_mesh(per_slice, granule) for granule in granules])",
        "grid = np.stack([mesh_utils.create_device_mesh(per_slice, granule) for granule in granules], -1).reshape(shape)",
        ("tests/test_compile.py", "-k", "two_slices"),
    ),
    Mutant(
        "loss: never chunked (a chip's whole logits live at the step's peak)",
        "freeatten_jax/training/loss.py",
        "MAX_LOGITS = 2**28",
        "MAX_LOGITS = 2**40",
        ("tests/test_memory_accounting.py",),
    ),
    Mutant(
        "memory accounting: the packed heap read from the VMEM report, not HBM's",
        "benchmarks/memory_accounting.py",
        'r"Memory Space: default \\(color=0\\)\\nTotal bytes: (\\d+)"',
        'r"Memory Space: vmem \\(color=1\\)\\nTotal bytes: (\\d+)"',
        ("tests/test_memory_accounting.py",),
    ),
    # --- attention/variants.py: one per formula (prepare or weight of each variant)
    Mutant(
        "softmax: 1/d instead of 1/sqrt(d)",
        VARIANTS_PY,
        'scale = 1.0 / math.sqrt(d) if opts.get("scale") is None else opts["scale"]',
        'scale = 1.0 / d if opts.get("scale") is None else opts["scale"]',
        oracle("softmax"),
    ),
    Mutant(
        "ssmax: log(N_i + 1) instead of log N_i",
        VARIANTS_PY,
        'factor_BTH1 = _per_head(opts["s"], num_heads) * _log_count_BTH1(n_BHT)',
        'factor_BTH1 = _per_head(opts["s"], num_heads) * _log_count_BTH1(n_BHT + 1)',
        oracle("ssmax"),
    ),
    Mutant(
        "lssa: k not L2-normalised",
        VARIANTS_PY,
        "return inverse_norm(q_BTHD) * temperature_BTH1, inverse_norm(k_BSKD)",
        "return inverse_norm(q_BTHD) * temperature_BTH1, None",
        oracle("lssa"),
    ),
    Mutant(
        "lssa/lssar: softplus wrong for negative scores",
        VARIANTS_PY,
        "jnp.log1p(jnp.exp(-jnp.abs(x)))",
        "jnp.log1p(jnp.exp(-x))",
        oracle("lssa"),
    ),
    Mutant(
        "lssar: re-weighting offset o_i = 0.5",
        VARIANTS_PY,
        "jnp.where(n > 3, 1.0, 0.0)",
        "jnp.where(n > 3, 0.5, 0.0)",
        oracle("lssar"),
    ),
    Mutant(
        "sigmoid: bias -log N_i dropped",
        VARIANTS_PY,
        "jax.nn.sigmoid(scores - log_count(n))",
        "jax.nn.sigmoid(scores)",
        oracle("sigmoid"),
    ),
    Mutant(
        "relu: divided by N_i - 1",
        VARIANTS_PY,
        "jax.nn.relu(scores) / jnp.maximum(n, 1)",
        "jax.nn.relu(scores) / jnp.maximum(n - 1, 1)",
        oracle("relu"),
    ),
    # --- attention implementations: one each
    Mutant(
        "reference: softmax ignores the mask",
        "freeatten_jax/attention/reference.py",
        "jax.nn.softmax(jnp.where(visible, scores, NEG_INF), axis=-1) * visible",
        "jax.nn.softmax(scores, axis=-1) * visible",
        oracle("softmax"),
    ),
    # --- attention/rules.py: the row rules every implementation runs; each must fail each one's tests
    *every_implementation(
        "rules: online softmax does not rescale the accumulator", "ctx.pv(w, v, acc * scale)", "ctx.pv(w, v, acc)", "softmax"
    ),
    *every_implementation(
        "rules: LSSAR's integer power one too high",
        "jax.lax.integer_pow(y, ctx.static_power - 1)",
        "jax.lax.integer_pow(y, ctx.static_power)",
        "lssar",
    ),
    *every_implementation(
        "rules: LSSAR's dk/dq without the E_i term",
        '(rho_pm1 * rows["factor"]) - rows["e"])',
        '(rho_pm1 * rows["factor"]))',
        "lssar",
    ),
    Mutant(
        "fused: 1/sqrt(d) applied twice",
        "freeatten_jax/attention/auto.py",
        "scale=1.0, is_causal=mask.causal",
        "scale=None, is_causal=mask.causal",
        ("tests/test_blockwise.py", "-k", "fused_path_matches_reference"),
    ),
    Mutant(
        "fused: bidirectional ssmax with causal N_i",
        "freeatten_jax/attention/auto.py",
        "jnp.arange(1, t + 1)[None, None] if mask.causal else jnp.full((1, 1, t), t)",
        "jnp.arange(1, t + 1)[None, None]",
        ("tests/test_blockwise.py", "-k", "fused_path_matches_reference"),
    ),
    # --- rare inputs and bfloat16
    Mutant(
        "lssar: a row within rounding of uniform re-weighted (no margin)",
        RULES_PY,
        "sharp = u_max > thr * (1.0 + REWEIGHT_MARGIN)",
        "sharp = u_max > thr",
        ("tests/test_degenerate.py", "-k", "lssar-blockwise"),
    ),
    Mutant(
        "reference: softplus's slope at 0 left to autodiff (0, not 1/2)",
        VARIANTS_PY,
        "_softplus.defjvp(",
        "_softplus = _softplus.fun or _softplus.defjvp(",
        ("tests/test_degenerate.py", "-k", "lssa-blockwise"),
    ),
    Mutant(
        "kernels: log2(1 + t)'s polynomial one coefficient short",
        RULES_PY,
        "    for c in LOG2_1P[2:]:",
        "    for c in LOG2_1P[3:]:",
        ("tests/test_degenerate.py", "-k", "base_2"),
    ),
    Mutant(
        "TPU kernels: log2(1 + t) without its small-t series",
        RULES_PY,
        "jnp.where(t < 2.0**-6, t * (LOG2E",
        "jnp.where(t < 0.0, t * (LOG2E",
        ("tests/test_degenerate.py", "-k", "base_2"),
    ),
    Mutant(
        "pallas: weights and ds rounded to bfloat16 once for every variant",
        "freeatten_jax/attention/pallas/core.py",
        "split = kind in SPLIT_BY_DEFAULT if split_matmuls is None else bool(split_matmuls)",
        "split = False if split_matmuls is None else bool(split_matmuls)",
        ("tests/test_pallas.py", "-k", "bfloat16_within and sigmoid"),
    ),
    Mutant(
        "pallas: D_i from the bfloat16 output (no low half)",
        "freeatten_jax/attention/pallas/core.py",
        "out_f32 = out if low is None else out.astype(jnp.float32) + low.astype(jnp.float32)",
        "out_f32 = out",
        ("tests/test_pallas.py", "-k", "bfloat16_within and ssmax"),
    ),
    Mutant(
        "auto: the kernels never picked above the reference's size",
        "freeatten_jax/attention/auto.py",
        'return "pallas" if kernels else "blockwise"',
        'return "blockwise"',
        ("tests/test_compile.py", "-k", "auto"),
    ),
    Mutant(
        "pallas: the kernels' float32 accumulators rounded to bfloat16 at every matmul",
        "freeatten_jax/attention/pallas/common.py",
        "        acc = dot(part, x, NN) + acc\n",
        "        acc = (dot(part, x, NN) + acc).astype(x.dtype).astype(jnp.float32)\n",
        ("tests/test_pallas.py", "tests/test_degenerate.py", "-k", "bfloat16"),
    ),
    Mutant(
        "GPU kernels: the weights' row sums in float32 while the weighted sums round the weights",
        "freeatten_jax/attention/pallas/gpu.py",
        "rounded = not cfg.split and jnp.dtype(cfg.dtype) != jnp.float32",
        "rounded = False",
        ("tests/test_pallas.py", "-k", "rounds_them or normalise_lssa"),
    ),
    Mutant(
        "GPU kernels: the weights' row sums rounded where split matmuls keep the weights exact",
        "freeatten_jax/attention/pallas/gpu.py",
        "rounded = not cfg.split and jnp.dtype(cfg.dtype) != jnp.float32",
        "rounded = jnp.dtype(cfg.dtype) != jnp.float32",
        ("tests/test_pallas.py", "-k", "rounds_them"),
    ),
    Mutant(
        "kernels: LSSAR's Z_i from rounded weights (θ_i then compares it with float32 u)",
        RULES_PY,
        "    return z + _row_sum(u), jnp.maximum(u_max, _row_max(u))",
        "    return z + ctx.row_sum(u), jnp.maximum(u_max, _row_max(u))",
        ("tests/test_degenerate.py", "-k", "bfloat16 and lssar"),
    ),
    Mutant(
        "kernels: softplus's max(s, 0) dropped from the polynomial's last fma",
        RULES_PY,
        "    return fma(acc, t, plus)",
        "    return fma(acc, t, 0.0)",
        ("tests/test_degenerate.py", "-k", "base_2"),
    ),
    Mutant(
        "kernel ring: LSSAR's dL/dp summed over the first ring step only",
        "freeatten_jax/attention/pallas/ring.py",
        "dpow + (0.0 if dp_r is None else jnp.sum(dp_r))",
        "(0.0 if dp_r is None else jnp.sum(dp_r))",
        ("tests/test_pallas.py", "-k", "power_gradient and kernel_ring"),
    ),
    Mutant(
        "misuse: q, k, v of different dtypes promoted silently",
        "freeatten_jax/attention/arguments.py",
        "    if len({jax.dtypes.canonicalize_dtype(x.dtype) for x in (q, k, v)}) > 1:",
        "    if False:",
        ("tests/test_misuse.py", "-k", "dtype"),
    ),
    Mutant(
        "misuse: a q_offset outside the cache accepted",
        "freeatten_jax/attention/arguments.py",
        "    _check_offset(q_offset, q_len, kv_len)\n",
        "\n",
        ("tests/test_misuse.py", "-k", "q_offset"),
    ),
    Mutant(
        "misuse: float segment ids cast to integers",
        "freeatten_jax/attention/arguments.py",
        "    if not any(jnp.issubdtype(jnp.result_type(x), kind) for kind in kinds):",
        "    if False:",
        ("tests/test_misuse.py", "-k", "float"),
    ),
    Mutant(
        "misuse: KV cache entries beyond its free slots written silently",
        "freeatten_jax/nn/attention_layer.py",
        "        if t > free:",
        "        if False:",
        ("tests/test_misuse.py", "-k", "cache"),
    ),
    # --- attention/block_plan.py: block skipping at the exact boundary (issues 15, 20), one planner for every implementation
    *every_skipping("plan: causal skip k_lo < q_hi", "maybe &= k_lo <= q_hi", "maybe &= k_lo < q_hi"),
    *every_skipping("plan: causal skip k_hi <= q_hi", "maybe &= k_lo <= q_hi", "maybe &= k_hi <= q_hi"),
    *every_skipping("plan: window skip one position short", "(q_lo - k_hi < mask.window)", "(q_lo - k_hi < mask.window - 1)"),
    # --- attention/pallas/ (api.py, tpu.py, ring.py): sharding, the TPU grid, the ring
    Mutant(
        "pallas: kernels not in shard_map inside a mesh",
        "freeatten_jax/attention/pallas/api.py",
        "    if mesh.empty or mesh.size == 1:",
        "    if True:",
        ("tests/test_pallas.py", "tests/test_compile.py", "-k", "per_shard or v5p"),
    ),
    Mutant(
        "ring: every data replica runs the whole batch",
        "freeatten_jax/attention/context_parallel.py",
        "rows, tokens = P(batch_axis, axis_name), P(batch_axis, axis_name, head_axis, None)",
        "rows, tokens = P(None, axis_name), P(None, axis_name, head_axis, None)",
        ("tests/test_compile.py", "-k", "context_parallel_step"),
    ),
    Mutant(
        "pallas: shard_map replicates the batch",
        "freeatten_jax/attention/pallas/api.py",
        "tokens, rows = P(batch, None, heads, None), P(batch, None)",
        "tokens, rows = P(None, None, heads, None), P(None, None)",
        ("tests/test_pallas.py", "-k", "per_shard"),
    ),
    Mutant(
        "pallas TPU kernels: a sweep's carry re-initialised at every key block",
        "freeatten_jax/attention/pallas/tpu.py",
        "pl.when((now == which) & step.first)",
        "pl.when(now == which)",
        ("tests/test_pallas.py", "-k", "reference and tpu"),
    ),
    Mutant(
        "tpu schedule: a folded row's second block starts a step late",
        "freeatten_jax/attention/pallas/tpu_schedule.py",
        "second = t >= split",
        "second = t > split",
        ("tests/test_tpu_schedule.py",),
    ),
    Mutant(
        "pallas TPU kernels: a plain causal mask swept over the full grid",
        "freeatten_jax/attention/pallas/tpu.py",
        "if not (cfg.causal and cfg.plain_length):",
        "if True:",
        ("tests/test_tpu_schedule.py", "-k", "fold_a_plain"),
    ),
    Mutant(
        "pallas TPU kernels: a plain bidirectional mask swept over causal spans",
        "freeatten_jax/attention/pallas/tpu.py",
        "if not (cfg.causal and cfg.plain_length):",
        "if not cfg.plain_length:",
        ("tests/test_tpu_schedule.py", "-k", "fold_a_plain"),
    ),
    Mutant(
        "pallas: a plain mask not passed on to the kernels",
        "freeatten_jax/attention/pallas/api.py",
        "plain_length=t if mask.plain else None",
        "plain_length=None",
        ("tests/test_tpu_schedule.py", "-k", "fold_a_plain"),
    ),
    Mutant(
        "pallas TPU kernels: dK/dV swept over the query-major causal spans",
        "freeatten_jax/attention/pallas/tpu.py",
        "Causal(cfg.plain_length, *blocks, key_major)",
        "Causal(cfg.plain_length, *blocks, False)",
        ("tests/test_pallas.py", "-k", "plain and tpu"),
    ),
    Mutant(
        "pallas TPU kernels: dK/dV reads only the first query head of its group",
        "freeatten_jax/attention/pallas/tpu.py",
        "return k * g + at(r, t).minor",
        "return k * g",
        ("tests/test_pallas.py", "-k", "reference and tpu"),
    ),
    # --- LSSAR's p differentiable on every path
    *every_p_path(
        "rules: dL/dp without the -D_i term",
        'jnp.log(rho) * (dp - rows["d"])',
        "jnp.log(rho) * dp",
    ),
    *every_p_path(
        "rules: dL/dp with unnormalised weights",
        'r * rows["inv_l"] * jnp.log(rho)',
        "r * jnp.log(rho)",
    ),
    Mutant(
        "pallas: dL/dp dropped (the old silent zero)",
        "freeatten_jax/attention/pallas/core.py",
        "dp_1 = jnp.sum(dpow).reshape(1) if cfg.p_grad else None",
        "dp_1 = None",
        ("tests/test_pallas.py", "-k", "finite_differences and pallas"),
    ),
    # --- block_plan.py: the mask-free interior blocks (the Pallas kernels take them)
    Mutant(
        "pallas: diagonal blocks taken as interior (k_hi <= q_hi)",
        BLOCK_PLAN_PY,
        "full &= k_hi <= q_lo",
        "full &= k_hi <= q_hi",
        (*BLOCK_EDGES, "-k", "pallas"),
    ),
    Mutant(
        "pallas: a block at the window's edge taken as interior",
        BLOCK_PLAN_PY,
        "full &= (q_hi - k_lo < mask.window)",
        "full &= (q_hi - k_lo <= mask.window)",
        (*BLOCK_EDGES, "-k", "pallas"),
    ),
    Mutant(
        "pallas: a block with a padding key taken as interior",
        BLOCK_PLAN_PY,
        "full = jnp.all(kvalid_BJC, axis=2)",
        "full = jnp.any(kvalid_BJC, axis=2)",
        (*BLOCK_EDGES, "-k", "pallas"),
    ),
    # --- compile/: without the chips
    Mutant(
        "freeatten-compile: a shared-memory overflow not recognised",
        "freeatten_jax/compile/run.py",
        'r"[Ss]hared memory size limit"',
        'r"shared-memory size limit"',
        ("tests/test_compile.py", "-k", "overflow"),
    ),
    Mutant(
        "freeatten-compile: the step compiled without training's loss targets",
        "freeatten_jax/compile/run.py",
        "return step.lower(abstract, batch)",
        'return step._replace(static={**step.static, "targets": None}).lower(abstract, batch)',
        ("tests/test_compile.py::test_the_compiled_step_is_the_one_training_runs",),
    ),
    Mutant(
        "freeatten-compile: a config's step needs its data files",
        "freeatten_jax/compile/run.py",
        "config.parse(cfg_dict, reads_data=False)",
        "config.parse(cfg_dict)",
        ("tests/test_compile.py::test_the_readmes_compile_command_needs_no_data",),
    ),
    Mutant(
        "config: training runs without data.path",
        "freeatten_jax/training/config.py",
        "reads_data: bool = True",
        "reads_data: bool = False",
        ("tests/test_config.py::test_files_need_a_path_unless_no_data_is_read",),
    ),
    Mutant(
        "signals: the first Ctrl-C is silent until the step ends",
        "freeatten_jax/training/signals.py",
        "        if not self.requested:\n            os.write(",
        "        if False:\n            os.write(",
        ("tests/training/test_signals.py",),
    ),
    Mutant(
        "cli: a second Ctrl-C prints KeyboardInterrupt's traceback",
        "freeatten_jax/cli/shared.py",
        "        except KeyboardInterrupt:\n            if flags",
        "        except ZeroDivisionError:\n            if flags",
        ("tests/training/test_signals.py",),
    ),
    Mutant(
        "config: a data.path beside a source that reads no files is ignored",
        "freeatten_jax/training/config.py",
        "if files and cfg.data.source not in FILE_SOURCES:",
        "if files and cfg.data.source not in (*FILE_SOURCES, *data.SOURCES):",
        ("tests/test_config.py", "-k", "data_path_without"),
    ),
    Mutant(
        "freeatten-compile: an overflow keeps the compiler's units (95.74G beside 95.00 GiB)",
        "freeatten_jax/compile/run.py",
        'detail = _COMPILER_SIZE.sub(r"\\1 \\2iB", detail)',
        "detail = detail",
        ("tests/test_compile.py", "-k", "units"),
    ),
    Mutant(
        "context parallel: K/V sent the wrong way round the ring",
        "freeatten_jax/attention/ring_mask.py",
        "[(d, (d + 1) % size) for d in range(size)]",
        "[(d, (d - 1) % size) for d in range(size)]",
        ("tests/test_context_parallel.py::test_matches_reference",),
    ),
    Mutant(
        "kernel ring: the forward passes never pass K/V on (each device sees only its own chunk)",
        "freeatten_jax/attention/pallas/ring.py",
        "passed_on = rotate(held, ring.axis_name, ring.size)  # issued first",
        "passed_on = held  # issued first",
        ("tests/test_context_parallel.py::test_kernel_ring_matches_reference",),
    ),
    Mutant(
        "kernel ring: dK/dV stay on the device that computed them",
        "freeatten_jax/attention/pallas/ring.py",
        "dk_sum, dv = rotate((dk_sum + dk_r, dv + dv_r), ring.axis_name, ring.size)",
        "dk_sum, dv = dk_sum + dk_r, dv + dv_r",
        ("tests/test_context_parallel.py::test_kernel_ring_matches_reference",),
    ),
    Mutant(
        "kernel ring: implementation='pallas' falls back to the blockwise rules",
        "freeatten_jax/attention/context_parallel.py",
        'if name == "blockwise":\n            return rules',
        "if True:\n            return rules",
        ("tests/test_context_parallel.py::test_kernel_ring_matches_reference",),
    ),
    # --- nn/attention_layer.py
    Mutant(
        "decode: default positions from the slot count, not the last position",
        "freeatten_jax/nn/attention_layer.py",
        "jnp.where(filled, self.positions_BS[:, last] + 1, 0)",
        "jnp.where(filled, self.positions_BS[:, last] * 0 + self.length, 0)",
        ("tests/test_generate.py::test_default_position_decoding_continues_an_explicit_position_prefill",),
    ),
    # --- training
    Mutant(
        "train step: gradients not divided by the micro-batch count",
        "freeatten_jax/training/step.py",
        "grads = jax.tree.map(lambda g: g / accum_steps, grads)",
        "grads = jax.tree.map(lambda g: g, grads)",
        ("tests/test_train.py::test_gradient_accumulation_matches_one_big_batch",),
    ),
    Mutant(
        "resume: train.seed may change",
        "freeatten_jax/training/resume.py",
        '"train.batch_size", "train.seed", "init.")',
        '"train.batch_size", "init.")',
        ("tests/training/test_resume.py::test_resume_check_refuses_each_fixed_field_and_allows_the_others",),
    ),
    # --- reliability: restore, fingerprints, divergence, rotation, atomic files, storage, exit codes, multi-process
    Mutant(
        "restore: files not probed before restoring (EIO reaches orbax)",
        "freeatten_jax/training/resume.py",
        "        ckpt.check_readable(step)\n",
        "",
        ("tests/training/test_resume.py", "-k", "unreadable_checkpoints_stop"),
    ),
    Mutant(
        "multi-host: processes the context axis spans read different rows",
        "freeatten_jax/training/distributed.py",
        "    return blocks.index(frozenset(rows[jax.process_index()])), len(blocks)",
        "    return jax.process_index(), jax.process_count()",
        ("tests/test_sharding.py", "-k", "same_batch_rows"),
    ),
    Mutant(
        "evaluation: a multi-process launcher not refused",
        "freeatten_jax/cli/evaluate.py",
        "if sign := distributed.multi_process_sign():",
        "if sign := None:",
        ("tests/test_multihost.py", "-k", "cannot_span"),
    ),
    Mutant(
        "misuse: a sharded attention's mesh not checked",
        "freeatten_jax/attention/mesh_axes.py",
        "if not isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):",
        "if False:",
        ("tests/test_misuse.py", "-k", "Mesh"),
    ),
    Mutant(
        "misuse: the harness model's workdir that is no run not named",
        "freeatten_jax/evaluation/harness.py",
        "    except CheckpointNotFoundError as e:",
        "    except KeyError as e:",
        ("tests/test_misuse.py", "-k", "workdir"),
    ),
    Mutant(
        "lock: the file stays after a clean exit",
        "freeatten_jax/training/lock.py",
        'os.unlink(path / "lock")',
        "os.stat(path)",
        (FAULTS, "-k", "lock_file_goes"),
    ),
    Mutant(
        "lock: a file its holder removed is locked",
        "freeatten_jax/training/lock.py",
        "if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:",
        "if True:",
        (FAULTS, "-k", "lock_file_goes"),
    ),
    Mutant(
        "preemption: the stop not said in a progress line",
        "freeatten_jax/training/loop.py",
        '        progress.log(f"{self.stop.name} at step {step}: saving a checkpoint, then stopping")\n',
        "",
        (FAULTS, "-k", "sigterm_saves"),
    ),
    Mutant(
        "restore: a read error counts as bad content",
        "freeatten_jax/training/checkpoint.py",
        "error.errno is not None and error.errno not in _CONTENT_ERRNOS:",
        "error.errno is not None and False:",
        ("tests/test_integrity.py::test_read_errors_are_unavailable_and_bad_content_is_not",),
    ),
    Mutant(
        "restore: every checkpoint bad, a rerun starts from scratch",
        "freeatten_jax/training/resume.py",
        "if bad or (quarantined.exists() and any(quarantined.iterdir())):",
        "if bad:",
        ("tests/training/test_resume.py", "-k", "every_checkpoint_is_bad"),
    ),
    Mutant(
        "fingerprint: restored arrays not compared",
        "freeatten_jax/training/checkpoint.py",
        'if bad := [k for k in sorted(arrays) if arrays[k] != fingerprints["state"].get(k)]:',
        "if bad := []:",
        ("tests/training/test_resume.py", "-k", "damaged_latest_checkpoint"),
    ),
    Mutant(
        "fingerprint: iterator state not compared",
        "freeatten_jax/training/checkpoint.py",
        'if integrity.iterator(data_iterator) != fingerprints["data_iterator"]:',
        "if False:",
        ("tests/training/test_resume.py", "-k", "damaged_latest_checkpoint and next_index"),
    ),
    Mutant(
        "fingerprint: blind to where a value sits",
        "freeatten_jax/training/integrity.py",
        "broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(stride % (1 << 32))",
        "broadcasted_iota(jnp.uint32, x.shape, axis) * 0",
        ("tests/test_integrity.py::test_array_fingerprints_see_any_changed_element_and_not_the_sharding",),
    ),
    Mutant(
        "data fingerprint: changed data resumed silently",
        "freeatten_jax/training/resume.py",
        "if (change := integrity.files_changed(saved, now)) is None:",
        "if True:",
        ("tests/training/test_resume.py", "-k", "changed_data"),
    ),
    Mutant(
        "divergence: one step short of spike_steps",
        "freeatten_jax/training/divergence.py",
        "return self.run >= self.steps",
        "return self.run >= self.steps - 1",
        ("tests/test_integrity.py", "-k", "spike_rule"),
    ),
    Mutant(
        "divergence: spikes feed the running median",
        "freeatten_jax/training/divergence.py",
        "            return True\n        self.history.append(loss)",
        "            self.history.append(loss)\n            return True",
        ("tests/test_integrity.py", "-k", "spike_rule"),
    ),
    Mutant(
        "rotation: the confirmed checkpoint may be deleted",
        "freeatten_jax/training/checkpoint.py",
        "c.step in newest or c.step == self.confirmed[0]",
        "c.step in newest",
        ("tests/training/test_rollback.py",),
    ),
    Mutant(
        "metrics: rewritten, not appended",
        "freeatten_jax/training/metrics.py",
        'with open(self.path, "a") as f:',
        'with open(self.path, "w") as f:',
        ("tests/test_integrity.py", "-k", "metrics_lines"),
    ),
    Mutant(
        "state files: written in place",
        "freeatten_jax/training/storage.py",
        'temporary = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"',
        "temporary = target",
        ("tests/test_integrity.py", "-k", "atomically"),
    ),
    Mutant(
        "storage: a failed async save noticed at the next checkpoint",
        "freeatten_jax/training/loop.py",
        "            self.ckpt.check_for_errors()  # a background save that failed",
        "            pass  # a background save that failed",
        (FAULTS, "-k", "failing_in_the_background"),
    ),
    Mutant(
        "storage: a failed async save that orbax's finalize thread took first goes unnoticed until the next save",
        "freeatten_jax/training/checkpoint.py",
        "        if not self.saving():\n            self.wait()",
        "        if False:\n            self.wait()",
        (FAULTS, "-k", "failed_save_stops and ulimit"),
    ),
    Mutant(
        "storage: tensorstore's callbacks into a failed save's closed loop reported (tracebacks)",
        "freeatten_jax/cli/shared.py",
        "    if not _into_a_closed_loop(report):",
        "    if True:",
        (FAULTS, "-k", "closed_loop"),
    ),
    Mutant(
        "storage: a failed save re-raised by the next save is a traceback",
        "freeatten_jax/training/checkpoint.py",
        "self._reporting(lambda: self.manager.save(step, args=args, force=True))",
        "self.manager.save(step, args=args, force=True)",
        (FAULTS, "-k", "failed_save_stops or next_save_re_raises"),
    ),
    Mutant(
        "data: a training file that changed is not checked before a checkpoint",
        "freeatten_jax/training/rollback.py",
        "    watch.check(force=True)",
        "    pass",
        (FAULTS, "-k", "changes_while_training"),
    ),
    # --- rollback: rollback.py's rules, each caught by tests/training/test_rollback.py
    Mutant(
        "rollback: a non-finite loss not stopped",
        ROLLBACK_PY,
        '        if not metrics["finite"]:',
        "        if False:",
        rollback_test("test_a_non_finite_loss_moves_aside_the_checkpoint_it_was_computed_from_and_keeps_the_one_before"),
    ),
    Mutant(
        "rollback: a non-finite loss keeps the checkpoint it was computed from",
        ROLLBACK_PY,
        "if spikes.run else step) - 1",
        "if spikes.run else step + 1) - 1",
        rollback_test("test_a_non_finite_loss_moves_aside_the_checkpoint_it_was_computed_from_and_keeps_the_one_before"),
    ),
    Mutant(
        "rollback: a non-finite loss during a spike keeps the checkpoints from before the spike",
        ROLLBACK_PY,
        "first_bad = (spikes.first_spike if spikes.run else step) - 1",
        "first_bad = step - 1",
        rollback_test("test_a_non_finite_loss_during_a_spike_moves_aside_every_checkpoint_from_the_one_before_the_spike"),
    ),
    Mutant(
        "rollback: the first bad checkpoint kept",
        ROLLBACK_PY,
        "if s >= first_bad]",
        "if s > first_bad]",
        rollback_test("test_a_non_finite_loss_moves_aside_the_checkpoint_it_was_computed_from_and_keeps_the_one_before"),
    ),
    Mutant(
        "rollback: non-finite parameters saved",
        ROLLBACK_PY,
        '    if not _all_finite(state["params"]):',
        "    if False:",
        rollback_test("test_parameters_that_are_not_finite_after_a_finite_step_are_not_saved"),
    ),
    Mutant(
        "rollback: non-finite parameters move the checkpoint before them aside",
        ROLLBACK_PY,
        "raise rolled_back(NonFiniteLossError, ckpt, step, ",
        "raise rolled_back(NonFiniteLossError, ckpt, step - 1, ",
        rollback_test("test_parameters_that_are_not_finite_after_a_finite_step_are_not_saved"),
    ),
    Mutant(
        "rollback: a diverging loss not stopped",
        ROLLBACK_PY,
        'if spikes.observe(step, float(metrics["loss"])) and spikes.diverged:',
        'if spikes.observe(step, float(metrics["loss"])) and False:',
        rollback_test("test_a_spike_for_spike_steps_steps_moves_aside_every_checkpoint_from_the_one_before_the_spike"),
    ),
    Mutant(
        "rollback: any spike stops the run",
        ROLLBACK_PY,
        'if spikes.observe(step, float(metrics["loss"])) and spikes.diverged:',
        'if spikes.observe(step, float(metrics["loss"])):',
        rollback_test("test_a_spike_shorter_than_spike_steps_stops_nothing"),
    ),
    Mutant(
        "rollback: divergence keeps the checkpoints saved during the spike",
        ROLLBACK_PY,
        "                spikes.first_spike - 1,",
        "                step - 1,",
        rollback_test("test_a_spike_for_spike_steps_steps_moves_aside_every_checkpoint_from_the_one_before_the_spike"),
    ),
    Mutant(
        "rollback: a diverged checkpoint quarantined as non-finite",
        ROLLBACK_PY,
        'ckpt.quarantine(s, "non-finite" if error_class is NonFiniteLossError else "diverged")',
        'ckpt.quarantine(s, "non-finite")',
        rollback_test("test_a_spike_for_spike_steps_steps_moves_aside_every_checkpoint_from_the_one_before_the_spike"),
    ),
    Mutant(
        "rollback: a checkpoint saved during a spike confirmed",
        ROLLBACK_PY,
        "self.unconfirmed < step and spikes.run == 0:",
        "self.unconfirmed < step:",
        rollback_test("test_a_checkpoint_saved_during_a_spike_is_not_confirmed_until_the_spike_ends"),
    ),
    Mutant(
        "rollback: a saved checkpoint not tracked for confirmation",
        ROLLBACK_PY,
        "        self.unconfirmed = step\n",
        "        pass\n",
        rollback_test("test_a_checkpoint_saved_during_a_spike_is_not_confirmed_until_the_spike_ends"),
    ),
    Mutant(
        "rollback: a fresh run confirms a checkpoint 0 it never saved",
        ROLLBACK_PY,
        "self.unconfirmed = start or None",
        "self.unconfirmed = start",
        rollback_test("test_a_fresh_run_confirms_nothing_before_its_first_checkpoint_and_a_resumed_one_its_start"),
    ),
    Mutant(
        "rollback: a checkpoint confirmed while it is still being written",
        ROLLBACK_PY,
        "if self.sound is not None and not self.ckpt.saving():",
        "if self.sound is not None:",
        rollback_test("test_a_checkpoint_is_confirmed_only_once_it_is_wholly_written_or_the_run_ends"),
    ),
    Mutant(
        "rollback: the last sound checkpoint not confirmed when the run ends",
        ROLLBACK_PY,
        "        if self.sound is not None:\n",
        "        if False:\n",
        rollback_test("test_a_checkpoint_is_confirmed_only_once_it_is_wholly_written_or_the_run_ends"),
    ),
    Mutant(
        "rollback: a resumed guard reads rows without a loss",
        ROLLBACK_PY,
        'if "loss" in m][-divergence.WINDOW :]',
        "][-divergence.WINDOW :]",
        rollback_test("test_a_resumed_guard_starts_from_the_last_window_of_logged_losses"),
    ),
    Mutant(
        "rollback: a resumed guard seeded with more than the window",
        ROLLBACK_PY,
        'if "loss" in m][-divergence.WINDOW :]',
        'if "loss" in m]',
        rollback_test("test_a_resumed_guard_starts_from_the_last_window_of_logged_losses"),
    ),
    Mutant(
        "rollback: a resumed guard seeded with the window's empty places",
        ROLLBACK_PY,
        "zip(steps, losses) if np.isfinite(x)]",
        "zip(steps, losses)]",
        rollback_test("test_a_resumed_guard_starts_from_the_last_window_of_logged_losses"),
    ),
    Mutant(
        "rollback: a resumed guard seeded with the logged losses, not replaying them (spikes in the median)",
        ROLLBACK_PY,
        "        for step, loss in logged:\n            self.spikes.observe(step, loss)\n",
        "        self.spikes.history.extend(loss for _, loss in logged)\n",
        rollback_test("test_a_resumed_guard_keeps_the_logged_spikes_out_of_the_median"),
    ),
    Mutant(
        "rollback: a kill -9 during a spike restarts its count (a rerun stops later and rolls back less far)",
        ROLLBACK_PY,
        "        for step, loss in logged:\n            self.spikes.observe(step, loss)\n",
        "        for step, loss in logged:\n            self.spikes.observe(step, loss)\n        self.spikes.run = 0\n",
        rollback_test("test_a_rerun_after_a_kill_9_during_a_spike_stops_where_an_uninterrupted_run_does_and_rolls_back_as_far"),
    ),
    Mutant(
        "data: a training file rewritten at the same size goes unnoticed",
        "freeatten_jax/data/watch.py",
        "            if now_mtime != mtime:",
        "            if False:",
        (FAULTS, "tests/test_integrity.py", "-k", "changes_while_training or file_watch"),
    ),
    Mutant(
        "multi-host: a process that stops on an error says done, its peers wait for it in a collective",
        "freeatten_jax/training/distributed.py",
        '"failed" if failed else "done"',
        '"done"',
        ("tests/test_multihost.py", "-k", "cannot_reach"),
    ),
    Mutant(
        "multi-host: a peer that failed is left, and jax aborts it in its shutdown barrier",
        "freeatten_jax/training/distributed.py",
        "            jax.distributed.shutdown()",
        "            pass",
        ("tests/test_multihost.py", "-k", "cannot_reach"),
    ),
    Mutant(
        "checkpoint: one without fingerprints restored silently",
        "freeatten_jax/training/resume.py",
        "        if fingerprints is None:\n            log(",
        "        if False:\n            log(",
        ("tests/test_multihost.py", "-k", "without_fingerprints"),
    ),
    Mutant(
        "shards: a changed size not checked",
        "freeatten_jax/data/shards.py",
        "if len(raw) != 2 * count or os.fstat(self._fd).st_size != self.file_size:",
        "if len(raw) != 2 * count:",
        ("tests/test_integrity.py", "-k", "shard_changing"),
    ),
    Mutant(
        "config: val_fraction 0 accepted",
        "freeatten_jax/training/config.py",
        'check=number(lambda v: 0 < v < 1, "a number in (0, 1)',
        'check=number(lambda v: 0 <= v < 1, "a number in (0, 1)',
        (FAULTS, "-k", "bad_training and val_fraction"),
    ),
    Mutant(
        "config: an old checkpoint's sentinels (-1, 0) kept, so it cannot resume",
        "freeatten_jax/training/checkpoint.py",
        "return config.upgrade(self.manager.restore(",
        "return (self.manager.restore(",
        ("tests/test_config.py", "-k", "old_sentinels"),
    ),
    Mutant(
        "config: the variant's option values unchecked",
        "freeatten_jax/nn/config.py",
        "        attention.variant_options(variant, options, num_heads)",
        "        pass",
        ("tests/test_model.py", "-k", "inconsistent"),
    ),
    Mutant(
        "--help exits 1",
        "freeatten_jax/cli/shared.py",
        "        sys.exit(0)",
        "        sys.exit(1)",
        ("tests/test_help.py", "-k", "generate"),
    ),
    Mutant(
        "eval: --switch=p=-3 accepted",
        "freeatten_jax/cli/evaluate.py",
        'math.isfinite(float(v)) and float(v) > 0, "a number > 0 or off"',
        'math.isfinite(float(v)), "a number > 0 or off"',
        (f"{FAULTS}::test_bad_eval_or_generate_input_is_one_error_line[switch p=-3]",),
    ),
    Mutant(
        "train command: the user's compilation cache replaced by one beside the data",
        "freeatten_jax/cli/train.py",
        "        if not jax.config.jax_compilation_cache_dir:\n",
        "        if True:\n",
        (f"{FAULTS}::test_the_train_command_keeps_the_users_compilation_cache_and_else_caches_beside_the_data",),
    ),
    Mutant(
        "exit code: SIGTERM exits 0",
        "freeatten_jax/cli/train.py",
        "cluster).preempted:",
        "cluster).preempted and False:",
        (FAULTS, "-k", "sigterm"),
    ),
    Mutant(
        "multi-process: a dead peer is never noticed",
        "freeatten_jax/training/distributed.py",
        "elif now - heard[p][1] > self.timeout_s:",
        "elif False:",
        ("tests/test_multihost.py",),
    ),
    Mutant(
        "corpus: the first download silent",
        "freeatten_jax/data/corpus.py",
        'print(f"fetching the default corpus',
        '(lambda *args, **kwargs: None)(f"fetching the default corpus',
        ("tests/test_data.py::test_the_first_fetch_says_what_it_does_and_a_cached_corpus_is_silent",),
    ),
    # --- evaluation
    Mutant(
        "report: a key rank without the candidates and chance's rank (passkey 0/1 beside rank 1.000)",
        "freeatten_jax/evaluation/report.py",
        'return f"mean rank of true key among {candidates} (chance {(candidates + 1) / 2:g})"',
        'return "mean rank of true key"',
        ("tests/test_eval.py::test_summary_pools_seeds_per_variant_and_switch",),
    ),
    Mutant(
        "eval loss: first train_len positions",
        "freeatten_jax/evaluation/loss.py",
        "losses_WT[:, -train_len:]",
        "losses_WT[:, :train_len]",
        (EVAL, "-k", "loss_last_train_len"),
    ),
    Mutant(
        "needle mass: 5 tokens off",
        "freeatten_jax/evaluation/attention_stats.py",
        "needle.start : needle.stop]",
        "needle.start + 5 : needle.stop + 5]",
        (EVAL, "-k", "needle_mass"),
    ),
    Mutant(
        "attention entropy: sign flipped",
        "freeatten_jax/evaluation/attention_stats.py",
        "ent_HT.append(np.asarray(-jnp.sum(",
        "ent_HT.append(np.asarray(jnp.sum(",
        (EVAL, "-k", "entropy_and_max"),
    ),
    Mutant(
        "passkey: scored by startswith, not first-integer equality",
        "freeatten_jax/evaluation/passkey.py",
        "return first_integer(generated_text) == key",
        "return generated_text.strip().startswith(key)",
        ("tests/test_eval.py::test_passkey_scoring_is_first_integer_equality_and_rank",),
    ),
    Mutant(
        "switch rope_theta=50x read as absolute 50",
        "freeatten_jax/evaluation/switches.py",
        "cfg.model.rope_theta * float(value[:-1])",
        "float(value[:-1])",
        (EVAL, "-k", "each_switch"),
    ),
    Mutant(
        "plots: no training-length mark on the loss plot",
        "freeatten_jax/evaluation/plots.py",
        '_mark_train_len(ax, {r.train_len for r in runs})\n    ax.set_xscale("log", base=2)\n    if lows:\n        ax.set_ylim(*y_limits(np.concatenate(lows), np.concatenate(highs), MIN_LOSS_SPAN))\n    _legend(ax)\n    return fig\n\n\ndef draw_per_position',  # noqa: E501
        'ax.set_xscale("log", base=2)\n    if lows:\n        ax.set_ylim(*y_limits(np.concatenate(lows), np.concatenate(highs), MIN_LOSS_SPAN))\n    _legend(ax)\n    return fig\n\n\ndef draw_per_position',  # noqa: E501
        ("tests/test_eval.py::test_loss_plot_has_interval_band_training_length_mark_and_a_minimum_span",),
    ),
    Mutant(
        "plots: y-axis zooms to the data (no minimum span)",
        "freeatten_jax/evaluation/plots.py",
        "pad = max((min_span - (hi - lo)) / 2, 0.05 * (hi - lo))",
        "pad = 0.05 * (hi - lo)",
        ("tests/test_eval.py::test_loss_plot_has_interval_band_training_length_mark_and_a_minimum_span",),
    ),
    Mutant(
        "plots: the loss plot without its interval band",
        "freeatten_jax/evaluation/plots.py",
        '(m["mean"], *m["ci"]) for m in summaries',
        '(m["mean"], m["mean"], m["mean"]) for m in summaries',
        ("tests/test_eval.py::test_loss_plot_has_interval_band_training_length_mark_and_a_minimum_span",),
    ),
    Mutant(
        "plots: retrieval never a heatmap",
        "freeatten_jax/evaluation/plots.py",
        "len(lengths) * len(depths) > 1 for",
        "len(lengths) * len(depths) > 99 for",
        ("tests/test_eval.py::test_retrieval_plot_is_a_depth_by_length_heatmap_when_the_grid_has_cells",),
    ),
    Mutant(
        "report: no warning for runs at different steps",
        "freeatten_jax/evaluation/report.py",
        '(("step", "checkpoint steps"), ("train_len", "training lengths"))',
        '(("train_len", "training lengths"),)',
        ("tests/test_eval.py::test_report_warns_when_compared_runs_differ_in_step_or_training_length",),
    ),
    Mutant(
        "load_run: orbax's restore warnings on the console",
        "freeatten_jax/training/run_dir.py",
        "    logger.setLevel(logging.ERROR)\n",
        "    logger.setLevel(level)\n",
        ("tests/test_eval.py::test_load_run_is_the_public_way_to_use_a_trained_model",),
    ),
    Mutant(
        "generate: on_token misses the first token",
        "freeatten_jax/nn/decoding.py",
        "    new_tokens = [token_B]\n    if on_token is not None:\n        on_token(token_B)\n",
        "    new_tokens = [token_B]\n",
        ("tests/test_generate.py::test_generate_reports_each_steps_tokens_to_on_token",),
    ),
    Mutant(
        "eval --quick: the full span",
        "freeatten_jax/evaluation/settings.py",
        "passkey_depths=(0.5,),",
        "passkey_depths=(0.1, 0.5, 0.9),",
        ("tests/test_eval.py::test_quick_settings_and_the_estimate_line",),
    ),
    Mutant(
        "attend: unknown options not naming the variant's",
        "freeatten_jax/attention/api.py",
        "{', '.join(get_variant(variant).defaults) or 'none'}",
        "none",
        ("tests/test_attention.py::test_errors",),
    ),
    Mutant(
        "train: warm-up longer than the run not said",
        "freeatten_jax/training/optim.py",
        "    if cfg_optim.warmup_steps < steps:\n        return []",
        "    if True:\n        return []",
        ("tests/test_train.py::test_a_short_run_says_its_first_step_and_what_its_schedule_misses",),
    ),
    Mutant(
        "train: the first step not logged",
        "freeatten_jax/training/loop.py",
        "            if step == start + 1:  # exclude compilation",
        "            if step == start + 2:  # exclude compilation",
        ("tests/test_train.py::test_a_short_run_says_its_first_step_and_what_its_schedule_misses",),
    ),
    Mutant(
        "mqar: the loss counts every position",
        "freeatten_jax/training/step.py",
        "    return losses_BT if targets is None else losses_BT[:, list(targets)]",
        "    return losses_BT",
        ("tests/test_mqar_training.py::test_the_training_loss_is_the_mean_over_the_answers_only",),
    ),
    Mutant(
        "mqar: answers one position late",
        "freeatten_jax/data/mqar.py",
        "    return tuple(range(context_tokens(task, length), length, 2))",
        "    return tuple(range(context_tokens(task, length) + 1, length, 2))",
        (
            "tests/test_mqar.py::test_training_windows_are_fresh_instances_fixed_by_seed_and_index_and_the_loss_counts_the_answers",
        ),
    ),
    Mutant(
        "cli: a plugin that fails to load keeps its 20-line traceback",
        "freeatten_jax/cli/shared.py",
        "            logging.get_absl_handler().addFilter(plugin_failure_in_one_line)\n",
        "",
        ("tests/test_config.py::test_a_plugin_that_fails_to_load_is_one_log_line",),
    ),
    Mutant(
        "mqar: every key queried once (the answers before a query narrow it down)",
        "freeatten_jax/data/mqar.py",
        "queried_P=rng.integers(task.pairs, size=task.pairs),",
        "queried_P=rng.permutation(task.pairs),",
        ("tests/test_mqar.py::test_queries_ask_for_pairs_drawn_with_replacement",),
    ),
    Mutant(
        "mqar: training windows ignore the seed",
        "freeatten_jax/data/mqar.py",
        "np.random.default_rng((self.seed, int(index)))",
        "np.random.default_rng((0, int(index)))",
        (
            "tests/test_mqar.py::test_training_windows_are_fresh_instances_fixed_by_seed_and_index_and_the_loss_counts_the_answers",
        ),
    ),
    Mutant(
        "softmax_logn: s still learned",
        "freeatten_jax/nn/attention_layer.py",
        'learned["s"] = self.s_H[...] if self.ssmax_learn_s else jax.lax.stop_gradient(self.s_H[...])',
        'learned["s"] = self.s_H[...]',
        ("tests/test_mqar_training.py::test_training_resumes_the_stream_and_the_control_keeps_s",),
    ),
    Mutant(
        "stats: each term draws its own seeds",
        "freeatten_jax/evaluation/stats.py",
        "        total_N += sign * values_RW[runs_NR[..., None], windows_NRW].mean(axis=(1, 2))",
        "        total_N += sign * values_RW[rng.integers(len(values_RW), size=runs_NR.shape)[..., None], windows_NRW].mean(axis=(1, 2))",  # noqa: E501
        ("tests/test_stats.py::test_a_contrast_draws_the_same_seeds_for_every_term",),
    ),
    Mutant(
        "paired: rise relative to softmax without softmax's 1x",
        "freeatten_jax/evaluation/paired.py",
        "_cell(stats.contrast([(1, diff[m]), (-1, diff[1])]))",
        "_cell(stats.contrast([(1, diff[m])]))",
        ("tests/test_paired.py",),
    ),
    Mutant(
        "mqar report: pairs a variant's seed k with another seed of softmax",
        "freeatten_jax/evaluation/mqar_report.py",
        "    ours, theirs = pick(rs), pick(base)\n",
        "    ours, theirs = pick(rs), pick(base)[::-1]\n",
        ("tests/test_mqar_training.py::test_the_report_pairs_each_variant_with_softmax_by_seed_and_instance",),
    ),
    Mutant(
        "spike rule: no absolute floor",
        "freeatten_jax/training/divergence.py",
        "        return max(self.factor * median, median + MIN_RISE)",
        "        return self.factor * median",
        ("tests/test_integrity.py::test_spike_rule_stops_after_k_times_the_median_for_m_steps_and_ignores_short_spikes",),
    ),
    Mutant(
        "optim: a new optimiser object per run (the train step is traced again)",
        "freeatten_jax/training/optim.py",
        "@functools.cache\ndef make(",
        "def make(",
        ("tests/test_train.py::test_a_second_run_of_the_same_config_in_one_process_reuses_the_traced_steps",),
    ),
    Mutant(
        "integrity: a new fingerprint program per call",
        "freeatten_jax/training/integrity.py",
        "@functools.cache\ndef _fingerprint_program(",
        "def _fingerprint_program(",
        ("tests/test_train.py::test_a_second_run_of_the_same_config_in_one_process_reuses_the_traced_steps",),
    ),
    Mutant(
        "cli: a native thread may write after the error line",
        "freeatten_jax/cli/shared.py",
        "        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n",
        "",
        (f"{FAULTS}::test_the_error_line_stays_last_and_whole_when_threads_report_errors_around_it",),
    ),
    Mutant(
        "cli: the error line may start in the middle of a thread's error report",
        "freeatten_jax/cli/shared.py",
        "    with _STDERR_LOCK:\n        sys.stderr.write(line",
        "    if True:\n        sys.stderr.write(line",
        (f"{FAULTS}::test_the_error_line_stays_last_and_whole_when_threads_report_errors_around_it",),
    ),
    # --- warm-start switch experiment, typed results, MQAR placements and per-query hits, seed-level statistics,
    # the frozen LSSA temperature (issues 33-35)
    Mutant(
        "eval: a warm-started run pooled with runs from scratch",
        "freeatten_jax/evaluation/suite.py",
        'variant=cfg.model.variant_name + (f" from {origin} +{loaded.step}" if origin else ""),',
        "variant=cfg.model.variant_name,",
        (
            "tests/training/test_warm_start.py::test_a_warm_start_holds_the_sources_weights_at_step_0_and_scores_as_the_switched_source",
        ),
    ),
    Mutant(
        "eval: WORKDIR@STEP evaluates the latest checkpoint",
        "freeatten_jax/evaluation/suite.py",
        "    loaded = load_run(workdir, step=step, mesh=mesh)",
        "    loaded = load_run(workdir, mesh=mesh)",
        (
            "tests/training/test_warm_start.py::test_a_warm_start_holds_the_sources_weights_at_step_0_and_scores_as_the_switched_source",
        ),
    ),
    Mutant(
        "results: results.json does not read back what was written",
        "freeatten_jax/evaluation/results.py",
        'return LengthLoss(**{k: tuple(v) if k.endswith("_ci") else v for k, v in x.items()})',
        "return LengthLoss(**x)",
        ("tests/test_eval.py::test_results_json_reads_back_the_typed_results_written",),
    ),
    Mutant(
        "eval --merge: results measured under other settings reported together",
        "freeatten_jax/evaluation/results.py",
        "        if theirs_is != ours_is:",
        "        if False:",
        ("tests/test_eval.py::test_merge_reports_earlier_results_beside_new_runs_measured_alike",),
    ),
    Mutant(
        "eval --merge: a checkpoint both merged and measured again",
        "freeatten_jax/evaluation/results.py",
        "        if again := sorted(names & {r.name for r in theirs}):",
        "        if again := []:",
        ("tests/test_eval.py::test_merge_reports_earlier_results_beside_new_runs_measured_alike",),
    ),
    # --- evaluation settings declared once, resumable evaluation (issues 48, 53)
    Mutant(
        "eval settings: MQAR settings not compared",
        "freeatten_jax/evaluation/settings.py",
        "kinds = {TEXT, MQAR} if mqar else {TEXT}",
        "kinds = {TEXT}",
        ("tests/test_eval_settings.py",),
    ),
    Mutant(
        "eval flags: a setting's check not applied",
        "freeatten_jax/cli/fields.py",
        "if value is None or value == [] and not self.empty_ok or self.check and not self.check[0](value):",
        "if value is None or value == [] and not self.empty_ok:",
        ("tests/test_eval_settings.py",),
    ),
    Mutant(
        "eval flags: the last setting without a flag",
        "freeatten_jax/cli/fields.py",
        "    for f in dataclasses.fields(cls):",
        "    for f in dataclasses.fields(cls)[:-1]:",
        ("tests/test_eval_settings.py",),
    ),
    Mutant(
        "eval merge: a setting older results lack read as null, not as its default",
        "freeatten_jax/evaluation/results.py",
        "json.dumps(theirs.get(key, defaults.get(key)))",
        "json.dumps(theirs.get(key))",
        ("tests/test_eval_settings.py", "-k", "before_a_setting"),
    ),
    Mutant(
        "figures: results files joined whose loss was measured otherwise",
        "scripts/figures_data.py",
        "            results.check_alike(",
        "            (",
        ("tests/test_figures.py", "-k", "several"),
    ),
    Mutant(
        "eval resume: a finished cell measured again",
        "freeatten_jax/evaluation/suite.py",
        "    saved = store.get(name)",
        "    saved = None",
        (RESUME, "-k", "skips"),
    ),
    Mutant(
        "eval resume: the key generator not restored from the cell read back",
        "freeatten_jax/evaluation/suite.py",
        '            rng.bit_generator.state = saved["rng"]\n',
        "",
        (RESUME, "-k", "middle"),
    ),
    Mutant(
        "eval resume: SIGTERM ignored",
        "freeatten_jax/evaluation/suite.py",
        "        if stop.requested:",
        "        if False:",
        (RESUME, "-k", "sigterm"),
    ),
    Mutant(
        "eval resume: cells measured under other settings mixed",
        "freeatten_jax/evaluation/suite.py",
        '    results.check_alike(\n        f"--out={out}", theirs, ours, keys,',
        '    (\n        f"--out={out}", theirs, ours, keys,',
        (RESUME, "-k", "refused"),
    ),
    Mutant(
        "eval: two evaluations on one --out",
        "freeatten_jax/evaluation/suite.py",
        '    with lock.hold(folder, flag="--out"):',
        "    if True:",
        (RESUME, "-k", "owns"),
    ),
    Mutant(
        "mqar report: a placement's cost taken the wrong way round (end minus start, end minus dilute)",
        "freeatten_jax/evaluation/mqar_report.py",
        "stats.seed_level([(1, per_instance(rs, multiplier, a)), (-1, per_instance(rs, multiplier, b))])",
        "stats.seed_level([(-1, per_instance(rs, multiplier, a)), (1, per_instance(rs, multiplier, b))])",
        ("tests/test_mqar_training.py::test_the_report_gives_placement_start_minus_end_per_variant_over_seeds",),
    ),
    Mutant(
        "check_figures: a figure's value not compared with its cell",
        "scripts/check_figures.py",
        '        if expected == "nothing" or not _equal(group.value, expected):',
        '        if expected == "nothing":',
        ("tests/test_figures.py::test_every_change_to_a_figure_of_the_real_documents_fails[figures]",),
    ),
    Mutant(
        "check_figures: an interval compared with its cell's interval of either type",
        "scripts/check_figures.py",
        "        found = cell.intervals.get(kind) if kind else None",
        "        found = next(iter(cell.intervals.values()), None) if kind else None",
        ("tests/test_figures.py::test_the_results_and_the_readme_pass",),
    ),
    Mutant(
        "check_figures: a Holm p-value not compared with its computation",
        "scripts/check_figures.py",
        '    for name, printed, computed in (("x", group.multiple, cell.multiple), ("p", group.p, cell.p)):',
        '    for name, printed, computed in (("x", group.multiple, cell.multiple),):',
        ("tests/test_figures.py::test_a_p_value_and_a_per_seed_figure_are_checked_against_the_computation",),
    ),
    Mutant(
        "figures_data: Holm's adjustment without its step-down factor",
        "scripts/figures_data.py",
        "        running = max(running, (len(p_values) - rank) * p_values[i])",
        "        running = max(running, p_values[i])",
        ("tests/test_figures.py::test_holm_adjusts_the_kth_smallest_by_the_cells_left_and_keeps_the_order",),
    ),
    Mutant(
        "mqar: the end placement leaves the pairs where training put them",
        "freeatten_jax/data/mqar.py",
        'return 0 if placement == "start" else length - instance.train_len',
        "return 0",
        ("tests/test_mqar.py",),
    ),
    Mutant(
        "mqar: a repeated query counted as first-time",
        "freeatten_jax/data/mqar.py",
        "repeated_P = np.array([q in queried_P[:j] for j, q in enumerate(queried_P)])",
        "repeated_P = np.zeros(len(queried_P), bool)",
        ("tests/test_mqar.py",),
    ),
    Mutant(
        "mqar report: first-time accuracy over every query",
        "freeatten_jax/evaluation/mqar_report.py",
        "fresh_RWP = [np.asarray(x.repeated) == 0 for x in rows]",
        "fresh_RWP = [np.asarray(x.repeated) >= 0 for x in rows]",
        ("tests/test_mqar_training.py::test_the_report_pairs_each_variant_with_softmax_by_seed_and_instance",),
    ),
    Mutant(
        "stats: the seed-level interval uses the normal quantile",
        "freeatten_jax/evaluation/stats.py",
        "scipy_stats.t.ppf((1 + level) / 2, runs - 1)",
        "scipy_stats.norm.ppf((1 + level) / 2)",
        ("tests/test_stats.py", "tests/test_paired.py"),
    ),
    Mutant(
        "lssa: the frozen temperature ignored",
        VARIANTS_PY,
        'length = opts.get("temperature_length")',
        "length = None",
        ("tests/test_attention.py", "-k", "frozen"),
    ),
    Mutant(
        "switch: p drops a frozen temperature",
        "freeatten_jax/evaluation/switches.py",
        'model.set_attention("lssar", **kept, p=None if value == "off" else float(value))',
        'model.set_attention("lssar", p=None if value == "off" else float(value))',
        ("tests/test_eval.py::test_the_p_switch_keeps_a_frozen_temperature",),
    ),
    Mutant(
        "gpu kernels: the weighted sum added outside the matmul's accumulator",
        "freeatten_jax/attention/pallas/common.py",
        "        acc = dot(part, x, NN) + acc\n",
        "        acc = acc + jnp.maximum(dot(part, x, NN), -jnp.inf)\n",
        ("tests/test_kernel_budget.py::test_gpu_budget_keeps_the_lssa_kernels_fused",),
    ),
    Mutant(
        "gpu kernels: exp2 in Triton's subnormal-safe form",
        "freeatten_jax/attention/pallas/gpu.py",
        "rcp=rcp_ptx, exp2=ex2_ptx)",
        "rcp=rcp_ptx)",
        ("tests/test_kernel_budget.py::test_gpu_budget_keeps_the_lssa_kernels_fused",),
    ),
    Mutant(
        "tpu bundles: masked and interior regions swapped",
        "benchmarks/tpu_bundles.py",
        "for m, i in zip(found[0::2], found[1::2]):",
        "for i, m in zip(found[0::2], found[1::2]):",
        ("tests/test_kernel_budget.py::test_tpu_bundle_table",),
    ),
    Mutant(
        "tpu_bundles: whole-kernel bundles count each diagonal pair as interior",
        "benchmarks/tpu_bundles.py",
        'pairs * interior["bundles"] + blocks * masked["bundles"]',
        'pairs * interior["bundles"] + blocks * interior["bundles"]',
        ("tests/test_kernel_budget.py::test_tpu_bundle_table",),
    ),
    Mutant(
        "tpu kernels: an earlier pass finished on every grid step",
        "freeatten_jax/attention/pallas/tpu.py",
        "pl.when((now == which) & step.last)(functools.partial(finish, one, load, new_refs))",
        "functools.partial(finish, one, load, new_refs)()",
        ("tests/test_kernel_budget.py::test_tpu_bundle_table",),
    ),
    Mutant(
        "gpu/tpu kernels: LSSAR's y split like the output",
        "freeatten_jax/attention/pallas/common.py",
        "functools.partial(weighted_dot, cfg.split), functools.partial(weighted_dot, False)",
        "functools.partial(weighted_dot, cfg.split), functools.partial(weighted_dot, cfg.split)",
        ("tests/test_pallas.py", "-k", "never_lssars_y"),
    ),
    Mutant(
        "output-only forward: inference runs the training forward",
        "freeatten_jax/attention/pallas/core.py",
        "return run_output(q, k, v, qs, ks, p_1, where)[0]",
        "return run_forward(q, k, v, qs, ks, p_1, where)[0]",
        ("tests/test_pallas.py", "-k", "without_a_gradient"),
    ),
    Mutant(
        "output-only forward: inference compiled as the training forward (its peak memory)",
        "freeatten_jax/attention/pallas/core.py",
        "run_output, run_forward = forward_for(cfg._replace(residuals=False)), forward_for(cfg)",
        "run_output, run_forward = forward_for(cfg), forward_for(cfg)",
        ("tests/test_compile.py", "-k", "inference_forward"),
    ),
    Mutant(
        "output-only forward: LSSAR's second pass still forms y",
        "freeatten_jax/attention/rules.py",
        "(_REWEIGHT_PASS1, Pass(_zeros_and_accumulator, _reweight_output_step, _reweight_output_finish)),",
        "None,",
        ("tests/test_pallas.py", "-k", "without_a_gradient"),
    ),
    Mutant(
        "output-only forward: the bfloat16 output's low half written without a gradient",
        "freeatten_jax/attention/pallas/common.py",
        "return cfg.residuals and jnp.dtype(cfg.dtype) != jnp.float32",
        "return jnp.dtype(cfg.dtype) != jnp.float32",
        ("tests/test_pallas.py", "-k", "without_a_gradient"),
    ),
    Mutant(
        "output-only forward: blockwise inference runs the training rule",
        "freeatten_jax/attention/blockwise.py",
        "return forward(output_rule, cfg_static._replace(p=p), q, kt, v, where)[0]",
        "return forward(rule, cfg_static._replace(p=p), q, kt, v, where)[0]",
        ("tests/test_pallas.py", "-k", "without_a_gradient"),
    ),
    Mutant(
        "output-only forward: the kernel ring's pass kernels built for training without a gradient",
        "freeatten_jax/attention/pallas/ring.py",
        "lowering.pass_call(cfg, shapes, which, tuple(rows), fresh)",
        "lowering.pass_call(cfg._replace(residuals=True), shapes, which, tuple(rows), fresh)",
        ("tests/test_context_parallel.py", "-k", "without_a_gradient"),
    ),
    Mutant(
        "tpu kernels: a packed block read back in another token order",
        "freeatten_jax/attention/pallas/common.py",
        "for j in range(cfg.pack)], axis=0)",
        "for j in reversed(range(cfg.pack))], axis=0)",
        (*NARROW_HEADS, "-k", "narrow"),
    ),
    Mutant(
        "tpu kernels: narrow heads never packed (a 64-wide row is half padding in HBM)",
        "freeatten_jax/attention/pallas/core.py",
        "return f if blocks.q % (16 * f) == 0 and blocks.k % (16 * f) == 0 else 1",
        "return 1",
        (*NARROW_HEADS, "-k", "narrow"),
    ),
    Mutant(
        "tpu kernels: narrow heads never packed, compiled (the step's kernels write lane-padded arrays)",
        "freeatten_jax/attention/pallas/core.py",
        "return f if blocks.q % (16 * f) == 0 and blocks.k % (16 * f) == 0 else 1",
        "return 1",
        ("tests/test_memory_accounting.py", "-k", "lane_padded_array"),
    ),
    Mutant(
        "kernel ring: the first step's rotations issued as soon as their inputs exist (a TPU then waits for one)",
        "freeatten_jax/attention/pallas/ring.py",
        "local = jax.lax.optimization_barrier((travelling, q))[0]",
        "local = travelling",
        ("tests/test_compile.py", "-k", "two_slices"),
    ),
    Mutant(
        "exposed_permutes: every permute counted as a ring rotation (the zig-zag layout's too)",
        "freeatten_jax/compile/run.py",
        "if len(cycle) < 2 or step.get(cycle[-1]) != cycle[0]:",
        "if False:",
        ("tests/test_compile.py", "-k", "context_parallel_step"),
    ),
    Mutant(
        "tpu kernels: keys packed by the query block",
        "freeatten_jax/attention/pallas/core.py",
        "keys = [packed(cfg, x, cfg.blocks.k) for x in (k, v)]",
        "keys = [packed(cfg, x, cfg.blocks.q) for x in (k, v)]",
        (*NARROW_HEADS, "-k", "narrow"),
    ),
    Mutant(
        "kernel_budget: the no-gradient row compiled with the gradient",
        "benchmarks/kernel_budget.py",
        'inference = compiled(variant, gradients=False)["fwd"]',
        'inference = compiled(variant)["fwd"]',
        ("tests/test_kernel_budget.py::test_tpu_bundle_table",),
    ),
    Mutant(
        "gpu dkv kernel: a key sub-block reads the span of the block of its own index",
        "freeatten_jax/attention/pallas/gpu.py",
        "b, j = pl.program_id(0), pl.program_id(2) // dkv_split(cfg)",
        "b, j = pl.program_id(0), pl.program_id(2)",
        ("tests/test_pallas.py", "-k", "smaller_dkv"),
    ),
    Mutant(
        "gpu dkv kernel: every key sub-block takes the first sub-block's key factors",
        "freeatten_jax/attention/pallas/gpu.py",
        "lambda b, k, j: (b, k, j // split, 0, j % split)",
        "lambda b, k, j: (b, k, j // split, 0, 0)",
        ("tests/test_pallas.py", "-k", "smaller_dkv"),
    ),
    Mutant(
        "pallas: block_k_dkv not passed to the kernels",
        "freeatten_jax/attention/pallas/api.py",
        "blocks = (block_q, block_k, block_k_dkv)",
        "blocks = (block_q, block_k, None)",
        ("tests/test_pallas.py", "-k", "smaller_dkv or dkv_key_block"),
    ),
    Mutant(
        "kernel_budget: the dK/dV kernel's scores counted at the key block, not its sub-block",
        "benchmarks/kernel_budget.py",
        'keys = args.block_k_dkv or block_k if kind == "dkv" else block_k',
        "keys = block_k",
        ("tests/test_kernel_budget.py::test_gpu_budget_of_a_smaller_dkv_key_block",),
    ),
    # --- Hugging Face import: RoPE in transformers 4's and 5's layouts, linear and llama3 scaling
    Mutant(
        "hf import: transformers 5's rope_parameters ignored (its base read as 10,000)",
        HF_LLAMA_PY,
        'rope = dict(hub.get("rope_scaling") or hub.get("rope_parameters") or {})',
        'rope = dict(hub.get("rope_scaling") or {})',
        (f"{HF_IMPORT}::test_a_rope_base_other_than_10000_is_imported[5]",),
    ),
    Mutant(
        "hf import: rope_parameters over transformers 4's rope_scaling",
        HF_LLAMA_PY,
        'rope = dict(hub.get("rope_scaling") or hub.get("rope_parameters") or {})',
        'rope = dict(hub.get("rope_parameters") or hub.get("rope_scaling") or {})',
        (ROPE_READINGS,),
    ),
    Mutant(
        "hf import: the top-level rope_theta over rope_parameters' own",
        HF_LLAMA_PY,
        'rope.setdefault("rope_theta", hub["rope_theta"])',
        'rope["rope_theta"] = hub["rope_theta"]',
        (f"{HF_IMPORT}::test_a_rope_base_other_than_10000_is_imported[5]",),
    ),
    Mutant(
        "hf import: transformers 4's top-level rope_theta ignored",
        HF_LLAMA_PY,
        'rope.setdefault("rope_theta", hub["rope_theta"])',
        'rope.setdefault("rope_theta", 10_000.0)',
        (f"{HF_IMPORT}::test_a_rope_base_other_than_10000_is_imported[4]",),
    ),
    Mutant(
        "hf import: rope_type's older name `type` ignored (a linear scaling imported as none)",
        HF_LLAMA_PY,
        'rope.setdefault("rope_type", rope.get("type", "default"))',
        'rope.setdefault("rope_type", "default")',
        (f"{HF_IMPORT}::test_rope_scaling_is_imported[linear]",),
    ),
    Mutant(
        "hf import: llama3's length before scaling defaults to 8192, not max_position_embeddings",
        HF_LLAMA_PY,
        'rope.setdefault("original_max_position_embeddings", hub["max_position_embeddings"])',
        'rope.setdefault("original_max_position_embeddings", 8192)',
        (ROPE_READINGS,),
    ),
    Mutant(
        "hf import: the scaling's fields not imported (factor 1)",
        HF_LLAMA_PY,
        "**{ours: rope[theirs] for theirs, ours in fields.items()},",
        "",
        (f"{HF_IMPORT}::test_rope_scaling_is_imported",),
    ),
    Mutant(
        "hf import: an unsupported rope_type (yarn, dynamic) not refused",
        HF_LLAMA_PY,
        'lambda c: c["rope_parameters"]["rope_type"] not in ROPE_TYPES,',
        "lambda c: False,",
        (BROKEN_HUB, "-k", "yarn or dynamic"),
    ),
    Mutant(
        "hf import: a scaling's missing field not named",
        HF_LLAMA_PY,
        'if missing := [name for name in ROPE_TYPES[rope["rope_type"]][1] if name not in rope]:',
        "if missing := []:",
        (BROKEN_HUB, "-k", "llama3"),
    ),
    Mutant(
        "hf import: partial_rotary_factor accepted",
        HF_LLAMA_PY,
        'lambda c: c["rope_parameters"].get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)) != 1.0,',
        "lambda c: False,",
        (BROKEN_HUB, "-k", "partial"),
    ),
    Mutant(
        "warm start: the source's RoPE scaling not taken (an imported Llama 3.1 unscaled)",
        "freeatten_jax/training/warm_start.py",
        '    "rope_scaling",\n',
        "",
        (f"{HF_IMPORT}::test_rope_scaling_is_imported",),
    ),
    Mutant(
        "rope: linear leaves the frequencies as they are",
        ROPE_PY,
        "return freq_F / scaling.factor",
        "return freq_F",
        (f"{ROPE_FREQUENCIES}[linear]",),
    ),
    Mutant(
        "rope: llama3's blend reversed",
        ROPE_PY,
        "return (1 - kept_F) * freq_F / scaling.factor + kept_F * freq_F",
        "return kept_F * freq_F / scaling.factor + (1 - kept_F) * freq_F",
        (f"{ROPE_FREQUENCIES}[llama3]",),
    ),
    Mutant(
        "rope: llama3's blend weight unclipped (the kept and the divided bands extrapolated)",
        ROPE_PY,
        "kept_F = jnp.clip(kept_F, 0.0, 1.0)",
        "kept_F = kept_F",
        (f"{ROPE_FREQUENCIES}[llama3]",),
    ),
    Mutant(
        "rope: llama3's bands by the period over 2 pi, not the wavelength",
        ROPE_PY,
        "wavelength_F = 2 * jnp.pi / freq_F",
        "wavelength_F = 1 / freq_F",
        (f"{ROPE_FREQUENCIES}[llama3]",),
    ),
    Mutant(
        "rope: an unknown scaling accepted",
        ROPE_PY,
        "if self.kind not in SCALINGS:",
        "if False:",
        ("tests/test_attention_layer.py::test_an_unknown_rope_scaling_is_refused_naming_it",),
    ),
    Mutant(
        "attention layer: RoPE scaling not applied",
        "freeatten_jax/nn/attention_layer.py",
        "apply_rope(x_BTND, positions_BT, self.rope_theta, self.rope_scaling)",
        "apply_rope(x_BTND, positions_BT, self.rope_theta)",
        (SWITCHES, "-k", "rope_linear"),
    ),
    Mutant(
        "transformer: the config's RoPE scaling not passed to the layers",
        "freeatten_jax/nn/transformer.py",
        "rope_scaling=cfg.rope_frequency_scaling,",
        "",
        (f"{HF_IMPORT}::test_rope_scaling_is_imported",),
    ),
    Mutant(
        "config: llama3's length before scaling not passed to the layers (Llama 3.1's 8192)",
        "freeatten_jax/nn/config.py",
        "self.rope_high_freq_factor, self.rope_original_len\n",
        "self.rope_high_freq_factor\n",
        (f"{HF_IMPORT}::test_rope_scaling_is_imported[llama3]",),
    ),
    Mutant(
        "config: llama3 with high_freq_factor <= low_freq_factor accepted (a division by zero)",
        "freeatten_jax/nn/config.py",
        'if self.rope_scaling == "llama3" and self.rope_high_freq_factor <= self.rope_low_freq_factor:',
        "if False:",
        ("tests/test_config.py::test_llama3_rope_scaling_needs_a_high_freq_factor_above_the_low_one",),
    ),
    Mutant(
        "freeatten-eval: a RoPE scaling switch by 0 accepted",
        "freeatten_jax/cli/evaluate.py",
        '_FACTOR = (lambda v: math.isfinite(float(v)) and float(v) > 0, "a finite number > 0")',
        '_FACTOR = (lambda v: True, "a finite number > 0")',
        ("tests/test_faults.py::test_bad_eval_or_generate_input_is_one_error_line", "-k", "rope_linear"),
    ),
    Mutant(
        "switch rope_linear applies llama3",
        "freeatten_jax/evaluation/switches.py",
        '"rope_linear": _rope_scaling("linear"),',
        '"rope_linear": _rope_scaling("llama3"),',
        (SWITCHES, "-k", "rope_linear"),
    ),
    Mutant(
        "switch rope_llama3: the length before scaling Llama 3.1's 8192, not the trained length",
        "freeatten_jax/evaluation/switches.py",
        "Scaling(kind, float(value), original_len=cfg.model.max_len)",
        "Scaling(kind, float(value))",
        (SWITCHES, "-k", "rope_llama3"),
    ),
]
