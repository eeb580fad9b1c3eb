"""The curated mutants of freeatten_jax/nn/ (layers, model, RoPE, sharding, decoding)."""

from .common import HF_IMPORT, SWITCHES, Mutant

ROPE_PY = "freeatten_jax/nn/rope.py"
ROPE_FREQUENCIES = "tests/nn/test_attention_layer.py::test_rope_frequencies_follow_hugging_faces_definitions"


MUTANTS = [
    Mutant(
        "together.block: a block's parameter gradients free to be postponed (no barrier with its input's)",
        "freeatten_jax/nn/together.py",
        "lambda _, g: jax.lax.optimization_barrier(g))",
        "lambda _, g: g)",
        ("tests/nn/test_transformer.py", "-k", "projections_and_blocks"),
    ),
    Mutant(
        "dense: the weight gradient free to be postponed (no barrier with the input's)",
        "freeatten_jax/nn/together.py",
        "return jax.lax.optimization_barrier(vjp(g))",
        "return vjp(g)",
        ("tests/nn/test_transformer.py", "-k", "projections_and_blocks"),
    ),
    Mutant(
        "mesh.slices: each slice's chips interleaved along 'context' (the ring crosses slices)",
        "freeatten_jax/nn/sharding.py",
        "grid = np.concatenate([mesh_utils.create_device_mesh(per_slice, granule) for granule in granules])",
        "grid = np.stack([mesh_utils.create_device_mesh(per_slice, granule) for granule in granules], -1).reshape(shape)",
        ("tests/compile/test_run.py", "-k", "two_slices"),
    ),
    Mutant(
        "misuse: KV cache entries beyond its free slots written silently",
        "freeatten_jax/nn/attention_layer.py",
        "        if t > free:",
        "        if False:",
        ("tests/attention/test_misuse.py", "-k", "cache"),
    ),
    # --- nn/attention_layer.py
    Mutant(
        "decode: default positions from the slot count, not the last position",
        "freeatten_jax/nn/attention_layer.py",
        "jnp.where(filled, self.positions_BS[:, last] + 1, 0)",
        "jnp.where(filled, self.positions_BS[:, last] * 0 + self.length, 0)",
        ("tests/nn/test_decoding.py::test_default_position_decoding_continues_an_explicit_position_prefill",),
    ),
    Mutant(
        "config: the variant's option values unchecked",
        "freeatten_jax/nn/config.py",
        "        attention.variant_options(variant, options, num_heads)",
        "        pass",
        ("tests/nn/test_transformer.py", "-k", "inconsistent"),
    ),
    Mutant(
        "generate: on_token misses the first token",
        "freeatten_jax/nn/decoding.py",
        "    new_tokens = [token_B]\n    if on_token is not None:\n        on_token(token_B)\n",
        "    new_tokens = [token_B]\n",
        ("tests/nn/test_decoding.py::test_generate_reports_each_steps_tokens_to_on_token",),
    ),
    Mutant(
        "softmax_logn: s still learned",
        "freeatten_jax/nn/attention_layer.py",
        'learned["s"] = self.s_H[...] if self.ssmax_learn_s else jax.lax.stop_gradient(self.s_H[...])',
        'learned["s"] = self.s_H[...]',
        ("tests/evaluation/test_mqar.py::test_training_resumes_the_stream_and_the_control_keeps_s",),
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
        ("tests/nn/test_attention_layer.py::test_an_unknown_rope_scaling_is_refused_naming_it",),
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
        ("tests/training/test_config.py::test_llama3_rope_scaling_needs_a_high_freq_factor_above_the_low_one",),
    ),
]
