"""Configs: every experiment file loads and validates; command-line overrides; clear errors."""
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

import configs.base
from freeatten_jax import attention, config_check
from freeatten_jax.model import validate as validate_model

VARIANT_FILES = ["softmax", "ssmax", "lssa", "lssar", "sigmoid", "relu"]


def _parse(*args):
    values = flags.FlagValues()
    argv = ["train.py", *args]
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=argv)
    values(argv)
    return values.config


@pytest.mark.parametrize("variant", VARIANT_FILES)
def test_every_experiment_file_is_a_valid_config(variant):
    cfg = _parse(f"--config=configs/{variant}.py:tiny")
    assert cfg.model.attention == variant
    config_check.validate(cfg)
    cfg = cfg.copy_and_resolve_references()
    cfg.model.vocab_size = 256
    validate_model(cfg.model)


def test_variant_files_match_the_attention_library():
    assert set(VARIANT_FILES) == set(attention.VARIANTS)


def test_command_line_overrides():
    cfg = _parse("--config=configs/lssar.py:gpt2_small", "--config.train.steps=7", "--config.mesh.shape=(1,2,4)",
                 "--config.optim.lr=0.5", "--config.data.path=/data/*.bin", "--config.train.seq_len=128")
    assert (cfg.train.steps, cfg.mesh.shape, cfg.optim.lr, cfg.data.path) == (7, (1, 2, 4), 0.5, "/data/*.bin")
    assert cfg.model.max_len == 128  # follows the training length
    assert cfg.model.num_layers == 12 and cfg.train.batch_size == 512


def test_lssar_power_is_overridable_from_the_command_line():
    assert _parse("--config=configs/lssar.py:tiny").model.attention_options.p == 15.0
    assert _parse("--config=configs/lssar.py:tiny", "--config.model.attention_options.p=3").model.attention_options.p == 3.0


def test_locked_config_rejects_unknown_fields():
    with pytest.raises(AttributeError, match="bogus"):
        _parse("--config=configs/softmax.py", "--config.train.bogus=1")


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("model.attention", "flash", "'softmax'"),
        ("data.source", "wikipedia", "'shakespeare', 'text', 'bin'"),
        ("data.tokenizer", "gpt2", "'byte', 'bpe'"),
        ("optim.schedule", "linear", "'cosine', 'constant'"),
        ("mesh.shape", (2, 2), "3 sizes"),
        ("train.steps", 0, "an integer >= 1"),
    ],
)
def test_invalid_field_is_one_line_naming_field_and_allowed_values(field, value, allowed):
    cfg = configs.base.get_config("softmax", "tiny")
    section, name = field.split(".")
    cfg[section][name] = value
    with pytest.raises(config_check.ConfigError) as err:
        config_check.validate(cfg)
    message = str(err.value)
    assert f"config.{field}={value!r}" in message and allowed in message and "\n" not in message


def test_unknown_variant_lists_the_valid_ones():
    with pytest.raises(config_check.ConfigError, match="'softmax', 'ssmax', 'lssa', 'lssar'"):
        config_check.validate(configs.base.get_config("softmaxx", "tiny"))


def test_batch_must_split_into_micro_batches():
    cfg = configs.base.get_config("softmax", "tiny")
    cfg.train.grad_accum_steps = 5
    with pytest.raises(config_check.ConfigError, match="grad_accum_steps"):
        config_check.validate(cfg)


def test_train_py_reports_a_bad_variant_in_one_line(tmp_path):
    cmd = [sys.executable, "train.py", "--config=configs/softmax.py:tiny", f"--workdir={tmp_path}", "--config.model.attention=nope"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: config.model.attention='nope' is invalid; allowed: one of 'softmax'")
