"""The README's examples run as written: the quickstart's commands (the installed entry points, in a temporary folder)
and its Python on the run they trained, then every other Python example."""

import json
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from helpers import read_metrics, subprocess_env, tiny_config

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


def _custom_layer(ns):
    """The user's own layer: its output is [B, T, E]; LSSAR's weights over the visible keys sum to one (causal)."""
    assert ns["y"].shape == (2, 16, 64) and np.isfinite(np.asarray(ns["y"])).all()
    weights = np.asarray(ns["weights"])
    assert weights.shape == (1, 4, 8, 8) and np.allclose(weights.sum(-1), 1, atol=1e-5)
    assert (np.triu(weights[0, 0], 1) == 0).all()


# a line that names the block: what its comments say it does, checked on its namespace (the docs pages' blocks and
# their checks: test_pages.py)
CHECKS = {"class MyAttention(nnx.Module)": _custom_layer}


def test_readme_python_blocks_run_and_do_what_their_comments_say():
    blocks = _blocks(_quickstart()[1], "python")
    named = [[check for line, check in CHECKS.items() if line in block] for block in blocks]
    assert [len(checks) for checks in named] == [1] * len(blocks) and len(blocks) == len(CHECKS), "a block without its check"
    for block, (check,) in zip(blocks, named):
        namespace = {"__name__": "readme"}
        exec(compile(block, str(README), "exec"), namespace)
        check(namespace)


def test_the_generate_example_produces_text(trained_run, text_glob, run_cli, tmp_path):
    """The README's freeatten-generate command as written (its run swapped for one trained here): every sample
    continues the prompt with text, and the speed line gives a rate."""
    from freeatten_jax.cli import generate as generate_cli

    (command,) = re.findall(r"`(freeatten-generate --workdir=runs/lssar-tiny [^`]+)`", README.read_text().replace("\n", " "))
    argv = shlex.split(command)
    workdir = trained_run("readme-generate", tiny_config("lssar", text_glob))
    args = [f"--workdir={workdir}" if a.startswith("--workdir=") else a for a in argv[1:]]
    code, lines = run_cli(generate_cli.main, *args)
    samples = "\n".join(lines[:-1]).split(f"\n{generate_cli.SEPARATOR}\n")
    prompt, count = _flags(argv)["--prompt"], int(_flags(argv)["--num_samples"])
    assert code == 0 and len(samples) == count and all(s.startswith(prompt) and len(s) > len(prompt) for s in samples)
    assert lines[-1].endswith(" tokens/s") and "nan" not in lines[-1]
