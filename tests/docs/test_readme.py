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


def _model(ns):
    """Model building: logits [1, 16, 256] float32 as its comment says; the prompt followed by 8 generated ids."""
    assert ns["logits"].shape == (1, 16, 256) and ns["logits"].dtype == np.float32
    tokens = np.asarray(ns["tokens"])
    assert tokens.shape == (1, 12) and (tokens[:, :4] == 0).all() and ((0 <= tokens) & (tokens < 256)).all()


def _custom_layer(ns):
    """The user's own layer: its output is [B, T, E]; LSSAR's weights over the visible keys sum to one (causal)."""
    assert ns["y"].shape == (2, 16, 64) and np.isfinite(np.asarray(ns["y"])).all()
    weights = np.asarray(ns["weights"])
    assert weights.shape == (1, 4, 8, 8) and np.allclose(weights.sum(-1), 1, atol=1e-5)
    assert (np.triu(weights[0, 0], 1) == 0).all()


def _switches(ns):
    """The eval-time switches: the layer is then plain LSSA with the new RoPE base and scaling, parameters unchanged
    (held on random tokens: the README's all-ones input has one value vector, which any weights reproduce)."""
    from flax import nnx

    def built(variant, **options):
        layer = ns["Attention"](64, 4, num_kv_heads=2, variant=variant, **options, rope_theta=500_000.0, rngs=nnx.Rngs(0))
        layer.set_rope_scaling(ns["Scaling"]("linear", 4.0))
        return layer

    x_BTE, positions_BT = np.random.default_rng(0).normal(size=(2, 16, 64)), np.arange(16)[None].repeat(2, 0)
    switched = ns["attn"](x_BTE, positions_BT=positions_BT)
    np.testing.assert_allclose(switched, built("lssa")(x_BTE, positions_BT=positions_BT), atol=1e-6)
    assert not np.allclose(switched, built("lssar", options={"p": 15.0})(x_BTE, positions_BT=positions_BT), atol=1e-4)


def _sharded(ns):
    """FSDP over every device: every parameter matrix is split over the devices, the logits cover the batch."""
    import jax

    assert ns["logits_BTV"].shape[:2] == (8, 64)
    sharded = [x for x in jax.tree.leaves(ns["nnx"].state(ns["model"], ns["nnx"].Param)) if x.ndim == 2]
    assert sharded and all(len(x.sharding.device_set) == jax.device_count() for x in sharded)


def _kernels(ns):
    """The Pallas kernels (interpret mode on this CPU) equal the reference."""
    attention, q = ns["attention"], ns["q"]
    np.testing.assert_allclose(ns["out"], attention.attend(q, q, q, variant="lssa", implementation="reference"), atol=1e-5)


CHECKS = {  # a line that names the block: what its comments say it does, checked on its namespace
    "ModelConfig(vocab_size=256": _model,
    "class MyAttention(nnx.Module)": _custom_layer,
    "attn.set_attention(": _switches,
    "sharding.build_sharded(": _sharded,
    'implementation="pallas"': _kernels,
}


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
