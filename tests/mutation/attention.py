"""The curated mutants of freeatten_jax/attention/: variants, rules, implementations, the planner, kernels, rings."""

from .common import Mutant

VARIANTS_PY = "freeatten_jax/attention/variants.py"


def oracle(variant: str) -> tuple[str, ...]:
    """The values-vs-oracle tests of one variant (ids are "[variant-scenario]")."""
    return ("tests/attention/test_api.py::test_values_match_oracle", "-k", f"[{variant}-")


BLOCK_EDGES = ("tests/attention/test_block_edges.py",)
NARROW_HEADS = "tests/attention/pallas/test_kernels.py", "tests/attention/test_context_parallel.py"


RULES_PY = "freeatten_jax/attention/rules.py"
BLOCK_PLAN_PY = "freeatten_jax/attention/block_plan.py"
SKIPPING = ("blockwise", "pallas and not tpu", "pallas_tpu_kernels", "context_parallel")  # test_block_edges' implementations
IMPLEMENTATIONS = {  # name: the values-and-gradients-vs-reference tests of that implementation ("-k" narrows to a variant)
    "blockwise": ("tests/attention/test_blockwise.py::test_blockwise_matches_reference",),
    "pallas GPU kernels": ("tests/attention/pallas/test_kernels.py::test_pallas_matches_reference", "-k", "gpu and "),
    "pallas TPU kernels": ("tests/attention/pallas/test_kernels.py::test_pallas_matches_reference", "-k", "tpu and "),
    "ring": ("tests/attention/test_context_parallel.py::test_matches_reference",),
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
            (f"tests/attention/pallas/test_kernels.py::test_lssar_power_gradient_matches_finite_differences[{path}]",),
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
    # --- attention/variants.py: one per formula (prepare or weight of each variant)
    Mutant(
        "variants.rule: p=None (re-weighting off) runs LSSAR's re-weighting, not LSSA",
        VARIANTS_PY,
        'return "sum" if self.normalise == "reweight" and opts.get("p") is None else self.normalise',
        'return self.normalise if self.normalise == "reweight" else self.normalise',
        ("tests/attention/test_api.py::test_lssar_p_and_off",),
    ),
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
        ("tests/attention/test_blockwise.py", "-k", "fused_path_matches_reference"),
    ),
    Mutant(
        "fused: bidirectional ssmax with causal N_i",
        "freeatten_jax/attention/auto.py",
        "jnp.arange(1, t + 1)[None, None] if mask.causal else jnp.full((1, 1, t), t)",
        "jnp.arange(1, t + 1)[None, None]",
        ("tests/attention/test_blockwise.py", "-k", "fused_path_matches_reference"),
    ),
    # --- rare inputs and bfloat16
    Mutant(
        "lssar: a row within rounding of uniform re-weighted (no margin)",
        RULES_PY,
        "sharp = u_max > thr * (1.0 + REWEIGHT_MARGIN)",
        "sharp = u_max > thr",
        ("tests/attention/test_degenerate.py", "-k", "lssar-blockwise"),
    ),
    Mutant(
        "reference: softplus's slope at 0 left to autodiff (0, not 1/2)",
        VARIANTS_PY,
        "_softplus.defjvp(",
        "_softplus = _softplus.fun or _softplus.defjvp(",
        ("tests/attention/test_degenerate.py", "-k", "lssa-blockwise"),
    ),
    Mutant(
        "kernels: log2(1 + t)'s polynomial one coefficient short",
        RULES_PY,
        "    for c in coeffs[2:]:",
        "    for c in coeffs[3:]:",
        ("tests/attention/test_degenerate.py", "-k", "base_2"),
    ),
    Mutant(
        "TPU kernels: log2(1 + t) without its small-t series",
        RULES_PY,
        "jnp.where(t < 2.0**-6, t * (LOG2E",
        "jnp.where(t < 0.0, t * (LOG2E",
        ("tests/attention/test_degenerate.py", "-k", "base_2"),
    ),
    Mutant(
        "pallas: weights and ds rounded to bfloat16 once for every variant",
        "freeatten_jax/attention/pallas/core.py",
        "split = kind in SPLIT_BY_DEFAULT if split_matmuls is None else bool(split_matmuls)",
        "split = False if split_matmuls is None else bool(split_matmuls)",
        ("tests/attention/pallas/test_kernels.py", "-k", "bfloat16_within and sigmoid"),
    ),
    Mutant(
        "pallas: D_i from the bfloat16 output (no low half)",
        "freeatten_jax/attention/pallas/core.py",
        "out_f32 = out if low is None else out.astype(jnp.float32) + low.astype(jnp.float32)",
        "out_f32 = out",
        ("tests/attention/pallas/test_kernels.py", "-k", "bfloat16_within and ssmax"),
    ),
    Mutant(
        "auto: the kernels never picked above the reference's size",
        "freeatten_jax/attention/auto.py",
        'return "pallas" if kernels else "blockwise"',
        'return "blockwise"',
        ("tests/compile/test_run.py", "-k", "auto"),
    ),
    Mutant(
        "pallas: the kernels' float32 accumulators rounded to bfloat16 at every matmul",
        "freeatten_jax/attention/pallas/common.py",
        "        acc = dot(part, x, NN) + acc\n",
        "        acc = (dot(part, x, NN) + acc).astype(x.dtype).astype(jnp.float32)\n",
        ("tests/attention/pallas/test_kernels.py", "tests/attention/test_degenerate.py", "-k", "bfloat16"),
    ),
    Mutant(
        "GPU kernels: the weights' row sums in float32 while the weighted sums round the weights",
        "freeatten_jax/attention/pallas/gpu.py",
        "rounded = not cfg.split and jnp.dtype(cfg.dtype) != jnp.float32",
        "rounded = False",
        ("tests/attention/pallas/test_kernels.py", "-k", "rounds_them or normalise_lssa"),
    ),
    Mutant(
        "GPU kernels: the weights' row sums rounded where split matmuls keep the weights exact",
        "freeatten_jax/attention/pallas/gpu.py",
        "rounded = not cfg.split and jnp.dtype(cfg.dtype) != jnp.float32",
        "rounded = jnp.dtype(cfg.dtype) != jnp.float32",
        ("tests/attention/pallas/test_kernels.py", "-k", "rounds_them"),
    ),
    Mutant(
        "kernels: LSSAR's Z_i from rounded weights (θ_i then compares it with float32 u)",
        RULES_PY,
        "    return z + _row_sum(u), jnp.maximum(u_max, _row_max(u))",
        "    return z + ctx.row_sum(u), jnp.maximum(u_max, _row_max(u))",
        ("tests/attention/test_degenerate.py", "-k", "bfloat16 and lssar"),
    ),
    Mutant(
        "kernels: softplus's max(s, 0) dropped from the polynomial's last fma",
        RULES_PY,
        "    return fma(acc, t, plus)",
        "    return fma(acc, t, 0.0)",
        ("tests/attention/test_degenerate.py", "-k", "base_2"),
    ),
    Mutant(
        "kernel ring: LSSAR's dL/dp summed over the first ring step only",
        "freeatten_jax/attention/pallas/ring.py",
        "dpow + (0.0 if dp_r is None else jnp.sum(dp_r))",
        "(0.0 if dp_r is None else jnp.sum(dp_r))",
        ("tests/attention/pallas/test_kernels.py", "-k", "power_gradient and kernel_ring"),
    ),
    Mutant(
        "misuse: q, k, v of different dtypes promoted silently",
        "freeatten_jax/attention/arguments.py",
        "    if len({jax.dtypes.canonicalize_dtype(x.dtype) for x in (q, k, v)}) > 1:",
        "    if False:",
        ("tests/attention/test_misuse.py", "-k", "dtype"),
    ),
    Mutant(
        "misuse: a q_offset outside the cache accepted",
        "freeatten_jax/attention/arguments.py",
        "    _check_offset(q_offset, q_len, kv_len)\n",
        "\n",
        ("tests/attention/test_misuse.py", "-k", "q_offset"),
    ),
    Mutant(
        "misuse: float segment ids cast to integers",
        "freeatten_jax/attention/arguments.py",
        "    if not any(jnp.issubdtype(jnp.result_type(x), kind) for kind in kinds):",
        "    if False:",
        ("tests/attention/test_misuse.py", "-k", "float"),
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
        ("tests/attention/pallas/test_kernels.py", "tests/compile/test_run.py", "-k", "per_shard or v5p"),
    ),
    Mutant(
        "ring: every data replica runs the whole batch",
        "freeatten_jax/attention/context_parallel.py",
        "rows, tokens = P(batch_axis, axis_name), P(batch_axis, axis_name, head_axis, None)",
        "rows, tokens = P(None, axis_name), P(None, axis_name, head_axis, None)",
        ("tests/compile/test_run.py", "-k", "context_parallel_step"),
    ),
    Mutant(
        "pallas: shard_map replicates the batch",
        "freeatten_jax/attention/pallas/api.py",
        "tokens, rows = P(batch, None, heads, None), P(batch, None)",
        "tokens, rows = P(None, None, heads, None), P(None, None)",
        ("tests/attention/pallas/test_kernels.py", "-k", "per_shard"),
    ),
    Mutant(
        "pallas TPU kernels: a sweep's carry re-initialised at every key block",
        "freeatten_jax/attention/pallas/tpu.py",
        "pl.when((now == which) & step.first)",
        "pl.when(now == which)",
        ("tests/attention/pallas/test_kernels.py", "-k", "reference and tpu"),
    ),
    Mutant(
        "tpu schedule: a folded row's second block starts a step late",
        "freeatten_jax/attention/pallas/tpu_schedule.py",
        "second = t >= split",
        "second = t > split",
        ("tests/attention/pallas/test_tpu_schedule.py",),
    ),
    Mutant(
        "pallas TPU kernels: a plain causal mask swept over the full grid",
        "freeatten_jax/attention/pallas/tpu.py",
        "if not (cfg.causal and cfg.plain_length):",
        "if True:",
        ("tests/attention/pallas/test_tpu_schedule.py", "-k", "fold_a_plain"),
    ),
    Mutant(
        "pallas TPU kernels: a plain bidirectional mask swept over causal spans",
        "freeatten_jax/attention/pallas/tpu.py",
        "if not (cfg.causal and cfg.plain_length):",
        "if not cfg.plain_length:",
        ("tests/attention/pallas/test_tpu_schedule.py", "-k", "fold_a_plain"),
    ),
    Mutant(
        "pallas: a plain mask not passed on to the kernels",
        "freeatten_jax/attention/pallas/api.py",
        "plain_length=t if mask.plain else None",
        "plain_length=None",
        ("tests/attention/pallas/test_tpu_schedule.py", "-k", "fold_a_plain"),
    ),
    Mutant(
        "pallas TPU kernels: dK/dV swept over the query-major causal spans",
        "freeatten_jax/attention/pallas/tpu.py",
        "Causal(cfg.plain_length, *blocks, key_major)",
        "Causal(cfg.plain_length, *blocks, False)",
        ("tests/attention/pallas/test_kernels.py", "-k", "plain and tpu"),
    ),
    Mutant(
        "pallas TPU kernels: dK/dV reads only the first query head of its group",
        "freeatten_jax/attention/pallas/tpu.py",
        "return k * g + at(r, t).minor",
        "return k * g",
        ("tests/attention/pallas/test_kernels.py", "-k", "reference and tpu"),
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
        ("tests/attention/pallas/test_kernels.py", "-k", "finite_differences and pallas"),
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
    Mutant(
        "context parallel: K/V sent the wrong way round the ring",
        "freeatten_jax/attention/ring_mask.py",
        "[(d, (d + 1) % size) for d in range(size)]",
        "[(d, (d - 1) % size) for d in range(size)]",
        ("tests/attention/test_context_parallel.py::test_matches_reference",),
    ),
    Mutant(
        "kernel ring: the forward passes never pass K/V on (each device sees only its own chunk)",
        "freeatten_jax/attention/pallas/ring.py",
        "passed_on = rotate(held, ring.axis_name, ring.size)  # issued first",
        "passed_on = held  # issued first",
        ("tests/attention/test_context_parallel.py::test_kernel_ring_matches_reference",),
    ),
    Mutant(
        "kernel ring: dK/dV stay on the device that computed them",
        "freeatten_jax/attention/pallas/ring.py",
        "dk_sum, dv = rotate((dk_sum + dk_r, dv + dv_r), ring.axis_name, ring.size)",
        "dk_sum, dv = dk_sum + dk_r, dv + dv_r",
        ("tests/attention/test_context_parallel.py::test_kernel_ring_matches_reference",),
    ),
    Mutant(
        "kernel ring: implementation='pallas' falls back to the blockwise rules",
        "freeatten_jax/attention/context_parallel.py",
        'if name == "blockwise":\n            return rules',
        "if True:\n            return rules",
        ("tests/attention/test_context_parallel.py::test_kernel_ring_matches_reference",),
    ),
    Mutant(
        "misuse: a sharded attention's mesh not checked",
        "freeatten_jax/attention/mesh_axes.py",
        "if not isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):",
        "if False:",
        ("tests/attention/test_misuse.py", "-k", "Mesh"),
    ),
    Mutant(
        "attend: unknown options not naming the variant's",
        "freeatten_jax/attention/api.py",
        "{', '.join(get_variant(variant).defaults) or 'none'}",
        "none",
        ("tests/attention/test_api.py::test_errors",),
    ),
    Mutant(
        "lssa: the frozen temperature ignored",
        VARIANTS_PY,
        'length = opts.get("temperature_length")',
        "length = None",
        ("tests/attention/test_api.py", "-k", "frozen"),
    ),
    Mutant(
        "gpu kernels: the weighted sum added outside the matmul's accumulator",
        "freeatten_jax/attention/pallas/common.py",
        "        acc = dot(part, x, NN) + acc\n",
        "        acc = acc + jnp.maximum(dot(part, x, NN), -jnp.inf)\n",
        ("tests/benchmarks/test_kernel_budget.py::test_gpu_budget_keeps_the_lssa_kernels_fused",),
    ),
    Mutant(
        "gpu kernels: exp2 in Triton's subnormal-safe form",
        "freeatten_jax/attention/pallas/gpu.py",
        "rcp=rcp_ptx, exp2=ex2_ptx)",
        "rcp=rcp_ptx)",
        ("tests/benchmarks/test_kernel_budget.py::test_gpu_budget_keeps_the_lssa_kernels_fused",),
    ),
    Mutant(
        "tpu kernels: an earlier pass finished on every grid step",
        "freeatten_jax/attention/pallas/tpu.py",
        "pl.when((now == which) & step.last)(functools.partial(finish, one, load, new_refs))",
        "functools.partial(finish, one, load, new_refs)()",
        ("tests/benchmarks/test_kernel_budget.py::test_tpu_bundle_table",),
    ),
    Mutant(
        "gpu/tpu kernels: LSSAR's y split like the output",
        "freeatten_jax/attention/pallas/common.py",
        "functools.partial(weighted_dot, cfg.split), functools.partial(weighted_dot, False)",
        "functools.partial(weighted_dot, cfg.split), functools.partial(weighted_dot, cfg.split)",
        ("tests/attention/pallas/test_kernels.py", "-k", "never_lssars_y"),
    ),
    Mutant(
        "output-only forward: inference runs the training forward",
        "freeatten_jax/attention/pallas/core.py",
        "return run_output(q, k, v, qs, ks, p_1, where)[0]",
        "return run_forward(q, k, v, qs, ks, p_1, where)[0]",
        ("tests/attention/pallas/test_kernels.py", "-k", "without_a_gradient"),
    ),
    Mutant(
        "output-only forward: inference compiled as the training forward (its peak memory)",
        "freeatten_jax/attention/pallas/core.py",
        "run_output, run_forward = forward_for(cfg._replace(residuals=False)), forward_for(cfg)",
        "run_output, run_forward = forward_for(cfg), forward_for(cfg)",
        ("tests/compile/test_run.py", "-k", "inference_forward"),
    ),
    Mutant(
        "output-only forward: LSSAR's second pass still forms y",
        "freeatten_jax/attention/rules.py",
        "(_REWEIGHT_PASS1, Pass(_zeros_and_accumulator, _reweight_output_step, _reweight_output_finish)),",
        "None,",
        ("tests/attention/pallas/test_kernels.py", "-k", "without_a_gradient"),
    ),
    Mutant(
        "output-only forward: the bfloat16 output's low half written without a gradient",
        "freeatten_jax/attention/pallas/common.py",
        "return cfg.residuals and jnp.dtype(cfg.dtype) != jnp.float32",
        "return jnp.dtype(cfg.dtype) != jnp.float32",
        ("tests/attention/pallas/test_kernels.py", "-k", "without_a_gradient"),
    ),
    Mutant(
        "output-only forward: blockwise inference runs the training rule",
        "freeatten_jax/attention/blockwise.py",
        "return forward(output_rule, cfg_static._replace(p=p), q, kt, v, where)[0]",
        "return forward(rule, cfg_static._replace(p=p), q, kt, v, where)[0]",
        ("tests/attention/pallas/test_kernels.py", "-k", "without_a_gradient"),
    ),
    Mutant(
        "output-only forward: the kernel ring's pass kernels built for training without a gradient",
        "freeatten_jax/attention/pallas/ring.py",
        "lowering.pass_call(cfg, shapes, which, tuple(rows), fresh)",
        "lowering.pass_call(cfg._replace(residuals=True), shapes, which, tuple(rows), fresh)",
        ("tests/attention/test_context_parallel.py", "-k", "without_a_gradient"),
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
        ("tests/benchmarks/test_memory_accounting.py", "-k", "lane_padded_array"),
    ),
    Mutant(
        "kernel ring: the first step's rotations issued as soon as their inputs exist (a TPU then waits for one)",
        "freeatten_jax/attention/pallas/ring.py",
        "local = jax.lax.optimization_barrier((travelling, q))[0]",
        "local = travelling",
        ("tests/compile/test_run.py", "-k", "two_slices"),
    ),
    Mutant(
        "tpu kernels: keys packed by the query block",
        "freeatten_jax/attention/pallas/core.py",
        "keys = [packed(cfg, x, cfg.blocks.k) for x in (k, v)]",
        "keys = [packed(cfg, x, cfg.blocks.q) for x in (k, v)]",
        (*NARROW_HEADS, "-k", "narrow"),
    ),
    Mutant(
        "gpu dkv kernel: a key sub-block reads the span of the block of its own index",
        "freeatten_jax/attention/pallas/gpu.py",
        "b, j = pl.program_id(0), pl.program_id(2) // dkv_split(cfg)",
        "b, j = pl.program_id(0), pl.program_id(2)",
        ("tests/attention/pallas/test_kernels.py", "-k", "smaller_dkv"),
    ),
    Mutant(
        "gpu dkv kernel: every key sub-block takes the first sub-block's key factors",
        "freeatten_jax/attention/pallas/gpu.py",
        "lambda b, k, j: (b, k, j // split, 0, j % split)",
        "lambda b, k, j: (b, k, j // split, 0, 0)",
        ("tests/attention/pallas/test_kernels.py", "-k", "smaller_dkv"),
    ),
    Mutant(
        "pallas: block_k_dkv not passed to the kernels",
        "freeatten_jax/attention/pallas/api.py",
        "blocks = (block_q, block_k, block_k_dkv)",
        "blocks = (block_q, block_k, None)",
        ("tests/attention/pallas/test_kernels.py", "-k", "smaller_dkv or dkv_key_block"),
    ),
    Mutant(
        "check_finite: scores allowed up to float32's max (beyond the masked logits' -1e30)",
        "freeatten_jax/attention/finite.py",
        "    if score >= SCORE_LIMIT:",
        "    if score >= FLOAT32_MAX:",
        ("tests/attention/test_finite.py",),
    ),
]
