"""The README's examples run as written: the quickstart's commands (the installed entry points, in a temporary folder)
and its Python on the run they trained, then every other Python example."""

import json
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
from helpers import read_metrics, subprocess_env

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
BIN = pathlib.Path(sys.executable).parent


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _quickstart() -> tuple[str, str]:
    """(the Quickstart section, the rest of the README)."""
    text = README.read_text()
    start = text.index("## Quickstart\n")
    end = text.index("\n## ", start)
    return text[start:end], text[:start] + text[end:]


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv[1:] if "=" in a)


def _run(argv: list[str], cwd: pathlib.Path, optimised: bool = False) -> str:
    """stdout of the installed command `argv` on one CPU device (a laptop's; the suite forces 8), which must exit 0;
    `optimised`: with XLA's full CPU optimisation (the evaluation runs longer than it compiles)."""
    env = subprocess_env(1, optimised)
    result = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
    assert result.returncode == 0, (argv, result.stderr[-2000:])
    return result.stdout


@pytest.mark.slow
def test_quickstart_commands_and_load_run(text_glob, tmp_path, monkeypatch, capsys):
    """The quickstart's first bash block (a short training run, eval --quick; --help in test_help.py), then its Python
    on that run.
    The test adds one thing: its own corpus for training (`--config.data.source=text --config.data.path=...`, no
    network)."""
    section, _ = _quickstart()
    commands = [shlex.split(line, comments=True) for line in _blocks(section, "bash")[0].splitlines()]
    help_argv, train_argv, eval_argv = [c for c in commands if c]
    # the --help command's output from an empty folder: tests/cli/test_usage.py (the same command, run as installed)
    assert (help_argv, train_argv[0], eval_argv[0]) == (["freeatten-train", "--help"], "freeatten-train", "freeatten-eval")

    _run([*train_argv, "--config.data.source=text", f"--config.data.path={text_glob}"], tmp_path)
    flags = _flags(train_argv)
    steps, variant, workdir = int(flags["--config.train.steps"]), flags["--config"].split(":")[0], tmp_path / flags["--workdir"]
    metrics = read_metrics(workdir)
    assert metrics[-1]["step"] == steps and "val_loss" in metrics[-1]

    _run(eval_argv, tmp_path, optimised=True)
    out = tmp_path / _flags(eval_argv)["--out"]
    (result,) = json.loads((out / "results.json").read_text())["runs"]
    assert result["step"] == steps and [x["multiplier"] for x in result["lengths"]] == [1, 4, 16]  # --quick's lengths
    assert "## Plots" in (out / "report.md").read_text()

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    namespace = {"__name__": "readme"}
    exec(compile(_blocks(section, "python")[0], str(README), "exec"), namespace)
    assert capsys.readouterr().out.splitlines()[0] == f"{steps} {variant}" and namespace["run"].step == steps
    assert len(namespace["texts"]) == 2 and all(namespace["texts"])


def test_readme_python_blocks_run():
    blocks = _blocks(_quickstart()[1], "python")
    assert blocks, "README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
