"""The curated mutants of freeatten_jax/formats/ (Hugging Face import and export)."""

from .common import HF_IMPORT, Mutant

HF_LLAMA_PY = "freeatten_jax/formats/hf_llama.py"
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
]
