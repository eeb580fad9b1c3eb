"""Configs: every experiment file loads and parses into typed configs; command-line overrides; clear errors."""

import logging
import math
import os
import subprocess
import sys

import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from freeatten_jax import attention, configs, data
from freeatten_jax.cli import shared as cli
from freeatten_jax.configs import base, lm
from freeatten_jax.errors import ConfigError
from freeatten_jax.nn import preset, sharding
from freeatten_jax.training import checkpoint, config, resume


def _parse(*args):
    values = flags.FlagValues()
    argv = cli.config_argv(["train.py", *args])
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=argv)
    values(argv)
    return values.config


@pytest.mark.parametrize("variant", list(attention.VARIANTS))
@pytest.mark.parametrize("form", ["freeatten_jax/configs/lm.py:variant={},size=tiny", "lm:variant={}", "{}:tiny", "{}"])
def test_every_variant_is_a_valid_config_by_path_named_arguments_or_alias(variant, form):
    cfg = config.parse(_parse("--config=" + form.format(variant)))
    assert cfg.model.attention == variant and cfg.model.vocab_size == 256 and cfg.model.max_len == 64
    assert cfg.model.dtype == jnp.float32 and cfg.mesh.rules == sharding.DEFAULT_RULES


def test_packaged_names_resolve_to_the_one_experiment_file_and_paths_stay():
    assert (
        "variants: softmax, ssmax, lssa, lssar, sigmoid, relu, softmax_logn, lssa_fixed, lssar_fixed; "
        "sizes: tiny, gpt2_small, ssmax_162m" in configs.PACKAGED
    )
    assert configs.resolve("mqar:variant=lssa") == f"{configs.ROOT / 'mqar'}.py:variant=lssa"
    assert configs.resolve("softmax_logn:tiny") == f"{configs.ROOT / 'lm'}.py:variant=softmax_logn,size=tiny"
    assert configs.resolve("lssar:tiny") == f"{configs.ROOT / 'lm'}.py:variant=lssar,size=tiny"
    assert configs.resolve("lm:size=gpt2_small") == f"{configs.ROOT / 'lm'}.py:size=gpt2_small"
    assert configs.resolve("configs/lssar.py:tiny") == "configs/lssar.py:tiny"
    assert configs.resolve("my_experiment.py") == "my_experiment.py"


def test_the_frozen_temperature_controls_follow_the_training_length():
    """lssa_fixed / lssar_fixed freeze LSSA's temperature at log(d) log(train.seq_len), whatever seq_len is set to."""
    cfg = config.parse(_parse("--config=lssar_fixed:tiny", "--config.train.seq_len=128"))
    assert cfg.model.attention == "lssar" and cfg.model.variant_name == "lssar_fixed"
    assert dict(cfg.model.attention_options) == {"p": 15.0, "temperature_length": 128.0}
    assert config.parse(_parse("--config=lssa_fixed:tiny")).model.attention_options == {"temperature_length": 64.0}
    assert config.parse(_parse("--config=lssa:tiny")).model.variant_name == "lssa"


def test_named_arguments_set_variant_and_size_and_refuse_others():
    cfg = _parse("--config=lm:size=gpt2_small,variant=ssmax")
    assert (cfg.model.attention, cfg.model.num_layers, cfg.train.seq_len) == ("ssmax", 12, 1024)
    assert _parse("--config=lm").model.attention == "softmax"
    with pytest.raises(ConfigError, match="'depth' is not a named argument; allowed: variant=..., size=..."):
        lm.get_config("variant=lssar,depth=3")


def test_presets_leave_training_fields_to_the_training_config():
    """A preset sets only the network's shape: the variant and the length are the training config's."""
    with_data = lambda cfg: cfg.data.update(path="shards/*.bin") or cfg
    cfg = config.parse(with_data(base.get_config("softmax", "ssmax_162m")))
    assert cfg.model.attention == "softmax" and cfg.model.max_len == cfg.train.seq_len == 1024
    assert preset("ssmax_162m").attention == "softmax" and preset("tiny").max_len == 1024  # ModelConfig defaults
    typed = config.parse(with_data(base.get_config("lssar", "gpt2_small")))
    want = preset("gpt2_small", attention="lssar", attention_options={"p": 15.0, "temperature_length": None}, max_len=1024)
    assert typed.model == want


def test_vocab_size_none_takes_the_datas_and_the_command_line_can_set_it():
    assert _parse("--config=softmax:tiny", "--config.model.vocab_size=512").model.vocab_size == 512
    assert config.parse(_parse("--config=softmax:tiny", "--config.model.ssmax_s_init=0.3")).model.ssmax_s_init == 0.3
    cfg = base.get_config("softmax", "tiny")
    assert cfg.model.vocab_size is None and config.parse(cfg).model.vocab_size == 256
    cfg.data.update(tokenizer="bpe", bpe_vocab_size=4096)
    assert config.parse(cfg).model.vocab_size == 4096
    cfg.data.update(source="bin", path="x.bin")
    assert config.parse(cfg).model.vocab_size == 50257


def test_command_line_overrides():
    cfg = _parse(
        "--config=lssar:gpt2_small",
        "--config.train.steps=7",
        "--config.mesh.shape=(1,2,4)",
        "--config.optim.lr=0.5",
        "--config.data.path=/data/*.bin",
        "--config.train.seq_len=128",
        "--config.train.profile_steps=(10,12)",
        "--config.train.peak_tflops=989",
    )
    assert (cfg.train.steps, cfg.mesh.shape, cfg.optim.lr, cfg.data.path) == (7, (1, 2, 4), 0.5, "/data/*.bin")
    assert cfg.model.max_len == 128  # follows the training length
    assert cfg.model.num_layers == 12 and cfg.train.batch_size == 512
    typed = config.parse(cfg)
    assert typed.train.profile_steps == (10, 12) and typed.train.peak_tflops == 989 and typed.model.max_len == 128


def test_mesh_shape_takes_a_context_entry_from_the_command_line():
    assert config.parse(_parse("--config=lssa:tiny", "--config.mesh.shape=(2,1,1,4)")).mesh.shape == (2, 1, 1, 4)


def test_variant_options_are_overridable_from_the_command_line():
    assert _parse("--config=lssar:tiny").model.attention_options.p == 15.0
    assert _parse("--config=lssar:tiny", "--config.model.attention_options.p=3").model.attention_options.p == 3.0
    softmax = config.parse(_parse("--config=softmax:tiny", "--config.model.attention_options.scale=0.5"))
    assert softmax.model.attention_options == {"scale": 0.5}
    assert config.parse(base.get_config("softmax")).model.attention_options == {"scale": None}  # left off: 1/sqrt(d)


def test_locked_config_rejects_unknown_fields():
    with pytest.raises(AttributeError, match="bogus"):
        _parse("--config=softmax", "--config.train.bogus=1")


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("model.attention", "flash", "'softmax'"),
        ("data.source", "wikipedia", "'shakespeare', 'text', 'bin'"),
        ("data.tokenizer", "gpt2", "'byte', 'bpe'"),
        ("optim.schedule", "linear", "'cosine', 'constant'"),
        ("mesh.shape", (2, 2), "3 or 4 sizes"),
        ("train.steps", 0, "an integer >= 1"),
        ("train.profile_steps", (3, 2), "(first, last)"),
        ("model.dtype", "float16", "'float32', 'bfloat16'"),
        ("model.mlp", "relu2", "'gelu', 'swiglu'"),
        ("model.rope_scaling", "yarn", "'none', 'linear', 'llama3'"),
    ],
)
def test_invalid_field_is_one_line_naming_field_and_allowed_values(field, value, allowed):
    cfg = base.get_config("softmax", "tiny")
    section, name = field.split(".")
    cfg[section][name] = value
    with pytest.raises(ConfigError) as err:
        config.parse(cfg)
    message = str(err.value)
    assert f"config.{field}={value!r}" in message and allowed in message and "\n" not in message


def test_llama3_rope_scaling_needs_a_high_freq_factor_above_the_low_one():
    """llama3 blends the frequencies between its two bounds (dividing by high - low): equal bounds are refused."""
    cfg = base.get_config("softmax", "tiny")
    cfg.model.rope_scaling, cfg.model.rope_low_freq_factor, cfg.model.rope_high_freq_factor = "llama3", 2.0, 2.0
    with pytest.raises(ConfigError, match="model.rope_high_freq_factor=2.0 must exceed model.rope_low_freq_factor=2.0"):
        config.parse(cfg)
    cfg.model.rope_high_freq_factor = 4.0
    assert config.parse(cfg).model.rope_frequency_scaling.high_freq_factor == 4.0


def test_unknown_variant_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="'softmax', 'ssmax', 'lssa', 'lssar'"):
        config.parse(base.get_config("softmaxx", "tiny"))


def test_batch_must_split_into_micro_batches():
    cfg = base.get_config("softmax", "tiny")
    cfg.train.grad_accum_steps = 5
    with pytest.raises(ConfigError, match="grad_accum_steps"):
        config.parse(cfg)


@pytest.mark.parametrize("source", ["text", "bin", "hf"])
def test_files_need_a_path_unless_no_data_is_read(source):
    """Training reads the files: an empty data.path is refused; freeatten-compile reads none (reads_data=False)."""
    cfg = base.get_config("softmax", "tiny")
    cfg.data.source = source
    needs = {"hf": "a dataset's name or a glob of its files"}.get(source, "a glob of files")
    with pytest.raises(ConfigError, match=f"^config.data.path is empty; data.source='{source}' needs {needs}$"):
        config.parse(cfg)
    assert config.parse(cfg, reads_data=False).model.vocab_size == {"text": 256, "bin": 50257, "hf": 257}[source]


@pytest.mark.parametrize("name", ["path", "val_path"])
@pytest.mark.parametrize("source", ["shakespeare", "mqar"])
def test_a_data_path_without_a_file_source_is_refused(source, name):
    """data.path (or val_path) with a source that reads no files was ignored: the run trained on Shakespeare."""
    cfg = base.get_config("softmax", "tiny")
    cfg.data.source, cfg.data[name] = source, "corpus/*.txt"
    with pytest.raises(ConfigError, match=f"config.data.{name} is set but data.source='{source}' reads no files") as raised:
        config.parse(cfg)
    assert str(raised.value).endswith(
        "set config.data.source to 'text' (text files), 'bin' (.bin token shards) or 'hf' (a Hugging Face dataset: its "
        "name, or its .parquet, .arrow or .jsonl files)"
    )
    cfg.data.source = "text"
    config.parse(cfg, reads_data=False)


def test_train_py_reports_a_bad_variant_in_one_line(tmp_path):
    cmd = [sys.executable, "train.py", "--config=softmax:tiny", f"--workdir={tmp_path}", "--config.model.attention=nope"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: config.model.attention='nope' is invalid; allowed: one of 'softmax'")
    )


def test_console_script_takes_a_packaged_config_from_any_directory(tmp_path):
    """`freeatten-train --config=NAME:ARG` from a directory with no configs/ in it (the installed entry point)."""
    code = "import sys; from freeatten_jax.cli.train import main; sys.argv[0] = 'freeatten-train'; main()"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-c", code, "--config=lssar:tiny", f"--workdir={tmp_path}", "--config.train.steps=0"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: config.train.steps=0 is invalid; allowed: an integer >= 1"


def test_a_config_saved_before_newer_fields_existed_still_parses():
    """Checkpoints keep their config as JSON: fields added later (profile_steps, peak_tflops) take their defaults."""
    saved = config.to_json(base.get_config("lssa", "tiny"))
    del saved["train"]["profile_steps"], saved["train"]["peak_tflops"]
    cfg = config.parse(config.from_json(saved))
    assert cfg.train.profile_steps == () and cfg.train.peak_tflops == 0.0 and cfg.model.attention == "lssa"


def _old_style_json(vocab_size: int) -> dict:
    """A config as the code before None placeholders saved it with checkpoints (sentinels -1 and 0), written by hand."""
    return {
        "model": {
            "vocab_size": vocab_size,
            "num_layers": 4,
            "num_heads": 4,
            "d_model": 128,
            "mlp_dim": 512,
            "num_kv_heads": 0,
            "max_len": 64,
            "attention": "ssmax",
            "attention_options": {},
            "implementation": "auto",
            "mlp": "gelu",
            "norm": "layernorm",
            "tie_embeddings": True,
            "use_bias": False,
            "dropout": 0.0,
            "remat": "none",
            "dtype": "float32",
            "param_dtype": "float32",
            "rope_theta": 10000.0,
            "ssmax_s_init": -1.0,
            "ssmax_bias": False,
        },
        "mesh": {
            "shape": [-1, 1, 1],
            "rules": [[name, list(axes) if isinstance(axes, tuple) else axes] for name, axes in sharding.DEFAULT_RULES],
        },
        "data": {
            "source": "shakespeare",
            "path": "",
            "val_path": "",
            "tokenizer": "byte",
            "bpe_vocab_size": 4096,
            "val_fraction": 0.05,
            "cache_dir": "",
            "num_workers": 0,
            "document_masking": "on",
            "eos_id": -1,
            "encoding": "utf-8",
            "errors": "strict",
            "retrieval_fraction": 0.0,
            "tokenizer_path": "",
            "allow_changed": False,
        },
        "optim": {
            "lr": 0.003,
            "schedule": "cosine",
            "warmup_steps": 50,
            "min_lr_ratio": 0.1,
            "b1": 0.9,
            "b2": 0.95,
            "eps": 1e-08,
            "weight_decay": 0.1,
            "clip_norm": 1.0,
        },
        "train": {
            "steps": 300,
            "batch_size": 32,
            "seq_len": 64,
            "grad_accum_steps": 1,
            "seed": 0,
            "log_every": 25,
            "eval_every": 50,
            "eval_windows": 64,
            "checkpoint_every": 100,
            "profile_steps": [],
            "peak_tflops": 0.0,
            "spike_factor": 5.0,
            "spike_steps": 3,
        },
        "checkpoint": {"max_to_keep": 3, "async_save": True, "allow_fresh_start": False},
    }


@pytest.mark.parametrize("vocab_size", [0, 257])  # 0: the data's (as saved), 257: resolved
def test_a_checkpoint_saved_with_the_old_sentinels_loads_and_resumes(vocab_size, tmp_path):
    """ssmax_s_init -1 (1/log(max_len)), eos_id -1 (the source's) and vocab_size 0 (the data's) read back as None."""
    manager = ocp.CheckpointManager(tmp_path / "checkpoints", item_names=checkpoint.ITEMS)
    manager.save(5, args=ocp.args.Composite(config=ocp.args.JsonSave(_old_style_json(vocab_size))))
    manager.wait_until_finished()
    saved = checkpoint.Checkpointer(tmp_path, read_only=True)
    typed = saved.run_config(5)
    assert typed.model.ssmax_s_init is None and typed.model.initial_ssmax_s == pytest.approx(1 / math.log(64))
    assert typed.data.eos_id is None and data.document_eos(typed.data) == 256 and typed.model.vocab_size == 257
    now = base.get_config("ssmax", "tiny")
    now.data.document_masking = "on"
    if vocab_size:
        now.model.vocab_size = vocab_size
    resume.check_resumable(saved.config_json(5), config.parse(now), 5, tmp_path)  # the same run: no field changed
    now.data.eos_id = 7
    with pytest.raises(ConfigError, match="config.data.eos_id is 7 but the checkpoint at step 5"):
        resume.check_resumable(saved.config_json(5), config.parse(now), 5, tmp_path)


def test_a_plugin_that_fails_to_load_is_one_log_line():
    """The CUDA plugin of the [compile] extra on a machine without cuDNN: jax logs the failure with a 20-line
    traceback at every command's start; the console scripts' log filter keeps one line (other records keep theirs)."""
    try:
        raise RuntimeError("Unable to load cuDNN. Is it installed?")
    except RuntimeError:
        failure = sys.exc_info()
    record = lambda name, msg, args: logging.LogRecord(name, logging.ERROR, "x.py", 1, msg, args, failure)
    plugin = record("jax._src.xla_bridge", "Jax plugin configuration error: Exception when calling %s.initialize()", ("cuda",))
    other = record("orbax", "save failed", ())
    assert cli.plugin_failure_in_one_line(plugin) and cli.plugin_failure_in_one_line(other)
    assert logging.Formatter().format(plugin) == (
        "Jax plugin configuration error: Exception when calling cuda.initialize(): Unable to load cuDNN. Is it installed? "
        "(--verbosity=1 shows the traceback)"
    )
    assert "Traceback" in logging.Formatter().format(other)
    with pytest.raises(SystemExit):
        cli.run(lambda argv: None, ["prog"])
    assert cli.plugin_failure_in_one_line in absl_logging.get_absl_handler().filters
