"""The curated mutants of freeatten_jax/formats/ (Hugging Face import and export)."""

from .common import HF_EXPORT, HF_IMPORT, Mutant

HF_LLAMA_PY = "freeatten_jax/formats/hf_llama.py"
HF_EXPORT_PY = "freeatten_jax/formats/hf_export.py"
IMPORT_CLI_PY = "freeatten_jax/cli/import_hf.py"
EXPORT_CLI_PY = "freeatten_jax/cli/export_hf.py"
ATTENTION_LAYER_PY = "freeatten_jax/nn/attention_layer.py"
MISTRAL = "tests/formats/test_hf_mistral.py"
QWEN2 = "tests/formats/test_hf_qwen2.py"
MISTRAL_LOGITS = f"{MISTRAL}::test_an_imported_mistral_gives_the_references_windowed_logits_and_greedy_tokens"
ROPE_READINGS = f"{HF_IMPORT}::test_config_jsons_rope_is_read_as_transformers_5_reads_it"
BROKEN_HUB = f"{HF_IMPORT}::test_an_unsupported_or_broken_folder_is_one_error_line_and_writes_nothing"


MUTANTS = [
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
    # --- Mistral's window, head_dim null, Qwen2's biases, Flax names, freeatten-import's error lines
    Mutant(
        "hf import: Mistral's sliding_window not read (full causal attention)",
        HF_LLAMA_PY,
        'window=hub.get("sliding_window") if hub["family"] == "mistral" else None,',
        "window=None,",
        (MISTRAL_LOGITS,),
    ),
    Mutant(
        "model window: one key wider than transformers' (|i - j| <= window, FlaxMistral's)",
        ATTENTION_LAYER_PY,
        "mask.update(window=self.window)",
        "mask.update(window=self.window + 1)",
        (MISTRAL_LOGITS,),
    ),
    Mutant(
        "model window: the KV cache attends without the window (decoding past it)",
        ATTENTION_LAYER_PY,
        "            window=self.window,\n",
        "",
        (MISTRAL_LOGITS,),
    ),
    Mutant(
        "hf import: head_dim null read as given (None * heads)",
        HF_LLAMA_PY,
        'hub["head_dim"] = hub.get("head_dim") or hub["hidden_size"] // hub["num_attention_heads"]',
        'hub.setdefault("head_dim", hub["hidden_size"] // hub["num_attention_heads"])',
        (f"{HF_IMPORT}::test_head_dim_null_and_a_llamas_sliding_window_are_read_as_transformers_reads_them",),
    ),
    Mutant(
        "hf import: Qwen2 without its q/k/v biases",
        HF_LLAMA_PY,
        'qkv_bias=hub["family"] == "qwen2",',
        "qkv_bias=False,",
        (f"{QWEN2}::test_an_imported_qwen2_gives_the_references_logits",),
    ),
    Mutant(
        "model qkv_bias: an output bias too (Qwen2 has none)",
        ATTENTION_LAYER_PY,
        'out = dict(o_E=param(None, zeros, (e,), ("embed",), param_dtype)) if use_bias else {}',
        'out = dict(o_E=param(None, zeros, (e,), ("embed",), param_dtype))',
        (f"{QWEN2}::test_an_imported_qwen2_gives_the_references_logits",),
    ),
    Mutant(
        "hf import: Qwen2's sliding window on some layers accepted",
        HF_LLAMA_PY,
        'lambda c: c["family"] == "qwen2" and (c.get("use_sliding_window")',
        'lambda c: False and (c.get("use_sliding_window")',
        (f"{QWEN2}::test_qwen2s_sliding_window_on_some_layers_is_one_error_line",),
    ),
    Mutant(
        "hf import: Flax parameter names not recognised",
        HF_LLAMA_PY,
        'if any(name.endswith((".kernel", ".embedding")) for name in files):',
        "if False:",
        ("tests/formats/test_hf_flax_names.py",),
    ),
    Mutant(
        "hf import: a Flax kernel read untransposed",
        HF_LLAMA_PY,
        "lambda w_IO, t=tensor: t.to_ours(w_IO.T)",
        "lambda w_IO, t=tensor: t.to_ours(w_IO.reshape(w_IO.shape[::-1]))",
        ("tests/formats/test_hf_flax_names.py",),
    ),
    Mutant(
        "freeatten-import: the folder not checked first (its errors named config.init.path=...)",
        IMPORT_CLI_PY,
        "        _check_folder(folders[0])\n",
        "        pass\n",
        (BROKEN_HUB, "-k", "gpt2"),
    ),
    Mutant(
        "freeatten-import: a refused override named config.init.path=...",
        IMPORT_CLI_PY,
        'str(e).replace(f"config.init.path={folders[0]}: ", f"{folders[0]}: ", 1)',
        "str(e)",
        (f"{HF_IMPORT}::test_a_refused_override_names_the_folder_not_config_init_path",),
    ),
    # --- export: the Hub model's special tokens and generation config; Mistral and Qwen2 families
    Mutant(
        "hf export: no special token ids (null, as before)",
        EXPORT_CLI_PY,
        "special = hub_tokens.special_tokens(loaded.workdir)",
        "special = ({}, {})",
        (f"{HF_EXPORT}::test_the_export_carries_the_hub_models_special_tokens_and_generation_config",),
    ),
    Mutant(
        "hf export: every model exported as a Llama (Mistral's window, Qwen2's architecture lost)",
        HF_EXPORT_PY,
        'return "qwen2" if model.qkv_bias else "mistral" if model.window is not None else "llama"',
        'return "llama"',
        (f"{MISTRAL}::test_import_export_gives_back_a_mistrals_tensors_and_window", QWEN2, "-k", "export"),
    ),
]
