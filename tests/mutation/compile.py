"""The curated mutants of freeatten_jax/compile/ (compiling for chips without them)."""

from .common import Mutant

MUTANTS = [
    # --- compile/: without the chips
    Mutant(
        "freeatten-compile: a shared-memory overflow not recognised",
        "freeatten_jax/compile/run.py",
        'r"[Ss]hared memory size limit"',
        'r"shared-memory size limit"',
        ("tests/compile/test_run.py", "-k", "overflow"),
    ),
    Mutant(
        "freeatten-compile: the step compiled without training's loss targets",
        "freeatten_jax/compile/run.py",
        "return step.lower(abstract, batch)",
        'return step._replace(static={**step.static, "targets": None}).lower(abstract, batch)',
        ("tests/compile/test_run.py::test_the_compiled_step_is_the_one_training_runs",),
    ),
    Mutant(
        "freeatten-compile: a config's step needs its data files",
        "freeatten_jax/compile/run.py",
        "config.parse(cfg_dict, reads_data=False)",
        "config.parse(cfg_dict)",
        ("tests/compile/test_run.py::test_the_readmes_compile_command_needs_no_data",),
    ),
    Mutant(
        "freeatten-compile: an overflow keeps the compiler's units (95.74G beside 95.00 GiB)",
        "freeatten_jax/compile/run.py",
        'detail = _COMPILER_SIZE.sub(r"\\1 \\2iB", detail)',
        "detail = detail",
        ("tests/compile/test_run.py", "-k", "units"),
    ),
    Mutant(
        "exposed_permutes: every permute counted as a ring rotation (the zig-zag layout's too)",
        "freeatten_jax/compile/run.py",
        "if len(cycle) < 2 or step.get(cycle[-1]) != cycle[0]:",
        "if False:",
        ("tests/compile/test_run.py", "-k", "context_parallel_step"),
    ),
]
