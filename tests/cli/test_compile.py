"""freeatten-compile's bad targets: one error line before anything is printed or compiled (the compiles themselves:
tests/compile/test_run.py)."""

import pytest

from freeatten_jax.cli import compile as compile_cli


@pytest.mark.parametrize("args", [("--attention=lssar",), ("--config=lssar:tiny",)])
@pytest.mark.parametrize("target", ["v5p-9", "tpu:v9:2x2", "3xh100"])
def test_an_unknown_target_is_one_error_line_and_nothing_else(target, args, run_cli):
    code, lines = run_cli(compile_cli.main, f"--target={target}", *args)
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"error: --target={target}: unknown target "), lines
