"""`--help` of the installed commands, run from an empty folder: exit 0, every flag and (with --config) every config
field with its default, type and allowed values, taken from the flag definitions and the config schema."""

import dataclasses
import functools
import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from freeatten_jax.training.config import SECTIONS

BIN = pathlib.Path(sys.executable).parent

CASES = {  # command line -> lines the help must contain
    "freeatten-train --help": [
        "  --config.train.steps=300 (int; allowed: an integer >= 1)",
        "  --config.model.attention=softmax (str; allowed: one of 'softmax', 'ssmax', 'lssa', 'lssar', 'sigmoid', 'relu')",
        "  --config.model.vocab_size=None (int; allowed: None or an integer >= 1)",
        "  --config.data.eos_id=None (int | None; allowed: None or an integer >= 0 and <= 65535)",
        "  --config.mesh.shape=(-1, 1, 1) (tuple; allowed: 3 or 4 sizes",
        "  --config.model.remat=none (str; allowed: one of 'none', 'dots', 'full')",  # a Literal type
        "  --config.model.ssmax_s_init=None (float | None; allowed: None or a number > 0)",
        "  --config.data.path='' (str)",
        "  --workdir=None (string, required)",
        "  --peer_timeout=60 (int; allowed: a positive integer)",
    ],
    "freeatten-train --config=lm:variant=lssar,size=gpt2_small --config.train.steps=7 --help": [
        "  --config.train.steps=7 (int;",
        "  --config.train.seq_len=1024 (int;",
        "  --config.model.attention=lssar (str;",
        "  --config.model.attention_options={'p': 15.0, 'temperature_length': None} (dict;",
        "  --config.model.dtype=bfloat16 (str; allowed: one of 'float32', 'bfloat16')",
    ],
    "freeatten-train --config=ssmax:tiny -h": [
        "  --config.model.attention=ssmax (str;",
        "      SSMax's initial s; None: 1/log(max_len)",
    ],
    "freeatten-eval --help": [
        "  --implementation=auto (string enum; allowed: reference, blockwise, pallas, auto)",
        "  --multipliers=[1, 2, 4, 8, 16] (comma separated list of int; allowed: integers >= 1 (lengths in training lengths)",
        "  --passkey_depths=[0.1, 0.5, 0.9] (comma separated list of float; allowed: numbers in [0, 1], e.g. 0.1,0.5)",
        "  --workdir=None (multi string, required)",
        "      Training run directory, or WORKDIR@STEP for one of its checkpoints (repeat for several).",
        "  --mqar_placements=['start', 'end', 'dilute'] (comma separated list of str; allowed: some of start, end, dilute)",
    ],
    "freeatten-generate --help": [
        "  --max_new_tokens=100 (int; allowed: a positive integer)",
        "  --top_p=None (float; allowed: a number in the range [0.0, 1.0])",
    ],
    "freeatten-compile --help": [
        "  --attention=None (string enum; allowed: softmax, ssmax, lssa, lssar, sigmoid, relu)",
        "  --target=None (string, required)",
        "  --config.model.implementation=auto (str; allowed: one of 'reference',",
    ],
}


@functools.cache
def _help(command: str) -> tuple[str, ...]:
    """stdout lines of `command` run in an empty folder, once per process (two tests read freeatten-train --help)."""
    name, *args = command.split()
    with tempfile.TemporaryDirectory() as empty:
        result = subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=120, cwd=empty)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr[-2000:]
    return tuple(result.stdout.splitlines())


@pytest.mark.parametrize("command", CASES)
def test_help_exits_0_with_defaults_types_and_allowed_values(command):
    lines = _help(command)
    missing = [want for want in CASES[command] if not any(line.startswith(want) for line in lines)]
    assert not missing, missing


def test_train_help_lists_every_field_of_every_section_with_its_help():
    lines = _help("freeatten-train --help")
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            at = next(i for i, line in enumerate(lines) if line.startswith(f"  --config.{section}.{f.name}="))
            assert lines[at + 1].strip().startswith(f.metadata["help"]), (section, f.name)


def test_a_command_prints_only_its_error_line_where_the_accelerator_plugins_are_installed(tmp_path):
    assert all(importlib.util.find_spec(plugin) for plugin in ("libtpu", "jax_plugins.xla_cuda13"))  # [compile]
    """The [compile] extra installs libtpu and the CUDA plugin; on a machine without their devices a command's stderr
    is its one error line (no plugin error, no libtpu lines), as long as JAX_PLATFORMS is left unset."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    command = [str(BIN / "freeatten-train"), "--config=lm:variant=lssa,size=tiny"]
    result = subprocess.run(
        [*command, "--config.optim.lr=-1", f"--workdir={tmp_path}"], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == ["error: config.optim.lr=-1.0 is invalid; allowed: a finite number > 0"]
