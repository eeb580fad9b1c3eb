"""The curated mutants that `make mutants` (tests/mutation/run.py) applies one at a time: one module a package of the
tree, beside the tests of that package, each mutant in the module of the file it breaks.

Add a mutant whenever a bug is found that the tests missed. Test paths not on this branch yet are skipped by the runner
(and named in its output); test_catalogue.py keeps every snippet and every named test in place.
"""

from . import attention, benchmarks, cli, compile, data, evaluation, formats, nn, scripts, training
from .common import Mutant, misplaced

MODULES = (attention, nn, training, evaluation, data, formats, cli, compile, benchmarks, scripts)
MUTANTS: list[Mutant] = [mutant for module in MODULES for mutant in module.MUTANTS]

__all__ = ["MUTANTS", "Mutant", "misplaced"]
