"""The curated mutants of benchmarks/ (the accounting and counting scripts)."""

from .common import Mutant

MUTANTS = [
    Mutant(
        "memory accounting: the packed heap read from the VMEM report, not HBM's",
        "benchmarks/memory_accounting.py",
        'r"Memory Space: default \\(color=0\\)\\nTotal bytes: (\\d+)"',
        'r"Memory Space: vmem \\(color=1\\)\\nTotal bytes: (\\d+)"',
        ("tests/benchmarks/test_memory_accounting.py",),
    ),
    Mutant(
        "tpu bundles: masked and interior regions swapped",
        "benchmarks/tpu_bundles.py",
        "for m, i in zip(found[0::2], found[1::2]):",
        "for i, m in zip(found[0::2], found[1::2]):",
        ("tests/benchmarks/test_kernel_budget.py::test_tpu_bundle_table",),
    ),
    Mutant(
        "tpu_bundles: whole-kernel bundles count each diagonal pair as interior",
        "benchmarks/tpu_bundles.py",
        'pairs * interior["bundles"] + blocks * masked["bundles"]',
        'pairs * interior["bundles"] + blocks * interior["bundles"]',
        ("tests/benchmarks/test_kernel_budget.py::test_tpu_bundle_table",),
    ),
    Mutant(
        "kernel_budget: the no-gradient row compiled with the gradient",
        "benchmarks/kernel_budget.py",
        'inference = compiled(variant, gradients=False)["fwd"]',
        'inference = compiled(variant)["fwd"]',
        ("tests/benchmarks/test_kernel_budget.py::test_tpu_bundle_table",),
    ),
    Mutant(
        "kernel_budget: the dK/dV kernel's scores counted at the key block, not its sub-block",
        "benchmarks/kernel_budget.py",
        'keys = args.block_k_dkv or block_k if kind == "dkv" else block_k',
        "keys = block_k",
        ("tests/benchmarks/test_kernel_budget.py::test_gpu_budget_of_a_smaller_dkv_key_block",),
    ),
]
