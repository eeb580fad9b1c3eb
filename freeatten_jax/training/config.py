"""The training config: typed, frozen sections whose fields (type, default, help, check) are the only description of
the config; the command line's ConfigDict is derived from them (`config_dict`) and turned back by `parse`."""

import codecs
import dataclasses
import importlib.util
import json
import math
from typing import Any

import ml_collections

from freeatten_jax import data
from freeatten_jax.errors import ConfigError
from freeatten_jax.nn import sharding
from freeatten_jax.nn.config import ModelConfig
from freeatten_jax.schema import BOOL, FINITE_POSITIVE, FRACTION, POSITIVE, integer, number, one_of, option, optional, validate
from freeatten_jax.training import optim


def _known_encoding(name) -> bool:
    try:
        return isinstance(name, str) and bool(codecs.lookup(name))
    except LookupError:
        return False


def _mesh_shape(v) -> bool:
    return isinstance(v, (tuple, list)) and len(v) in (3, 4) and all(isinstance(n, int) and (n >= 1 or n == -1) for n in v)


def _profile_steps(v) -> bool:
    return isinstance(v, (tuple, list)) and (not v or len(v) == 2 and all(isinstance(n, int) for n in v) and 1 <= v[0] <= v[1])


_MESH_SHAPE = (
    _mesh_shape,
    "3 or 4 sizes (data, fsdp, tensor[, context]), each >= 1 or -1 for 'the rest', e.g. '(1,1,1)' or '(2,1,1,4)'",
)
_PROFILE_STEPS = (_profile_steps, "() for none, or (first, last) steps with 1 <= first <= last, e.g. '(10,12)'")
_WANDB = (
    lambda v: v == "" or importlib.util.find_spec("wandb") is not None,
    "'' (off), or a project where wandb is installed: pip install 'freeatten_jax[wandb]'",
)


# the data sources that read data.path (and data.val_path) -> what data.path names for them
FILE_SOURCES = {"text": "a glob of files", "bin": "a glob of files", "hf": "a dataset's name or a glob of its files"}


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: str = option(
        "shakespeare",
        help="shakespeare (the default corpus) | text (data.path glob) | bin (llm.c token shards) "
        "| hf (a Hugging Face dataset: data.path its name, or a glob of its .parquet/.arrow/.jsonl files; data.hf_*) "
        "| mqar (synthetic multi-query associative recall, data.mqar_*)",
        check=one_of(tuple(data.SOURCES)),
    )
    path: str = option("", help="glob of text files or .bin training shards; hf: a dataset's name or a glob of its files")
    val_path: str = option(
        "", help="optional glob of .bin validation shards (hf: the dataset's files); else the last val_fraction of each file"
    )
    tokenizer: str = option(
        "byte",
        help="text sources' tokenizer (.bin shards are tokenized already); file: data.tokenizer_path's",
        check=one_of(tuple(data.TOKENIZERS)),
    )
    bpe_vocab_size: int = option(
        4096, help="the BPE tokenizer's vocabulary (trained locally, saved beside the data)", check=integer(257, 65536)
    )
    val_fraction: float = option(
        0.05,
        help="held-out fraction of each file when there is no val_path",
        check=number(lambda v: 0 < v < 1, "a number in (0, 1): validation needs held-out data (or set data.val_path)"),
    )
    cache_dir: str = option("", help="'': $XDG_CACHE_HOME/freeatten_jax or ~/.cache/freeatten_jax")
    num_workers: int = option(0, help="grain worker processes (0: load in the training process)", check=integer(0))
    document_masking: str = option(
        "auto",
        help="attention restarts per document: auto (on for .bin shards and hf rows) | on | off",
        check=one_of(tuple(data.DOCUMENT_MASKING)),
    )
    eos_id: int | None = option(
        None,
        help="the token opening each document; None: 50256 for .bin, a new token past the text tokenizer's",
        check=optional(integer(0, 65535)),
    )
    encoding: str = option(
        "utf-8", help="of text files (source=text)", check=(_known_encoding, "a Python codec name, e.g. 'utf-8' or 'latin-1'")
    )
    errors: str = option(
        "strict",
        help="undecodable bytes: strict (an error naming the file and offset) | replace | ignore",
        check=one_of(("strict", "replace", "ignore")),
    )
    tokenizer_path: str = option(
        "", help="a Hugging Face tokenizer.json: .bin shards' (e.g. GPT-2's) for passkey and generation; text's (tokenizer=file)"
    )
    retrieval_fraction: float = option(
        0.0, help="fraction of training windows replaced by synthetic passkey sequences", check=FRACTION
    )
    allow_changed: bool = option(False, help="resume although the data files differ from the checkpoint's", check=BOOL)
    hf_split: str = option("train", help="hf: the dataset's split (local files have one, train)")
    hf_subset: str = option("", help="hf: the dataset's configuration on the Hub (e.g. wikitext-103-raw-v1), if it has several")
    hf_column: str = option("text", help="hf: the column holding each row's text (a document)")
    mqar_form: str = option(
        "fused", help="mqar: fused (one token per key-value pair) | two_token (key, then value)", check=one_of(data.mqar.FORMS)
    )
    mqar_pairs: int = option(4, help="mqar: key-value pairs per sequence, each queried once at its end", check=integer(1))
    mqar_keys: int = option(8, help="mqar: distinct keys", check=integer(1))
    mqar_values: int = option(8, help="mqar: distinct values", check=integer(1))
    mqar_noise: int = option(16, help="mqar: distinct noise tokens filling the gaps", check=integer(1))


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = option(3e-3, help="peak learning rate", check=FINITE_POSITIVE)
    schedule: str = option("cosine", help="after linear warm-up", check=one_of(tuple(optim.SCHEDULES)))
    warmup_steps: int = option(50, help="linear warm-up steps", check=integer(0))
    min_lr_ratio: float = option(0.1, help="cosine floor, as a fraction of lr", check=FRACTION)
    b1: float = option(0.9, help="Adam's beta1")
    b2: float = option(0.95, help="Adam's beta2")
    eps: float = option(1e-8, help="Adam's epsilon")
    weight_decay: float = option(0.1, help="decoupled, matrices only", check=number(lambda v: v >= 0, "a number >= 0"))
    clip_norm: float = option(1.0, help="global gradient norm clip", check=POSITIVE)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = option(300, help="optimiser steps", check=integer(1))
    batch_size: int = option(32, help="global, in sequences, per optimiser step", check=integer(1))
    seq_len: int = option(64, help="the training length (eval extrapolates from it)", check=integer(1))
    grad_accum_steps: int = option(1, help="micro-batches per step (batch_size must be divisible by it)", check=integer(1))
    seed: int = option(0, help="parameters and data order", check=integer(0))
    log_every: int = option(25, help="steps between logged metrics", check=integer(1))
    wandb_project: str = option(
        "", help="Weights & Biases project to log the metrics to as well (the [wandb] extra); '': off", check=_WANDB
    )
    wandb_entity: str = option("", help="W&B entity (team or user) of wandb_project; '': your default")
    wandb_run_name: str = option("", help="W&B run name; '': W&B's own (the run is resumed on restart either way)")
    eval_every: int = option(50, help="steps between validations; 0: only at the end", check=integer(0))
    eval_windows: int = option(64, help="held-out windows of seq_len tokens per validation", check=integer(1))
    checkpoint_every: int = option(100, help="steps between checkpoints", check=integer(1))
    profile_steps: tuple[int, ...] = option(
        (), help="e.g. (10, 12): a jax.profiler trace of steps 10-12 to WORKDIR/profile", check=_PROFILE_STEPS
    )
    peak_tflops: float = option(
        0.0,
        help="per-device peak for MFU; 0: known for the device (H100, A100, TPU v4-v6), else not shown",
        check=number(lambda v: v >= 0, "a number >= 0 (0: known for the device)"),
    )
    spike_factor: float = option(
        5.0,
        help="divergence: stop when the loss is above this x its running median ...; 0: off",
        check=number(lambda v: v == 0 or (math.isfinite(v) and v > 1), "0 (off) or a finite number > 1"),
    )
    spike_steps: int = option(
        3, help="... for this many steps in a row; then roll back to the last confirmed checkpoint", check=integer(1)
    )


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    shape: tuple[int, ...] = option(
        (-1, 1, 1),
        help="('data', 'fsdp', 'tensor'[, 'context']) sizes, e.g. (1, -1, 1) for FSDP; -1 fills the rest",
        check=_MESH_SHAPE,
    )
    rules: tuple[tuple[str, Any], ...] = option(sharding.DEFAULT_RULES, help="logical axis -> mesh axes")
    slices: int = option(
        1, help="TPU slices the 'data' axis spans over DCN (fsdp, tensor and context stay inside each slice)", check=integer(1)
    )


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    max_to_keep: int = option(3, help="the newest ones; the last confirmed checkpoint is kept as well", check=integer(1))
    async_save: bool = option(True, help="write checkpoints while training goes on", check=BOOL)
    allow_fresh_start: bool = option(
        False,
        help="start from step 0 when the workdir shows progress but has no usable checkpoint (every one bad, or gone; else "
        "an error); the earlier run's metrics.jsonl, confirmed.json and tensorboard/ move to WORKDIR/previous/N",
        check=BOOL,
    )


@dataclasses.dataclass(frozen=True)
class InitConfig:
    path: str = option(
        "",
        help="'': random weights; else a warm start (a new run, step 0) from WORKDIR[@STEP], a trained run (its latest "
        "checkpoint unless @STEP), or a Hugging Face Llama folder: its weights with this run's attention (training.warm_start)",
    )


SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "mesh": MeshConfig,
    "checkpoint": CheckpointConfig,
    "init": InitConfig,
}
# Model fields the application fills in when the command line leaves them: field -> what the command line's value means.
MODEL_NOTES = {
    "vocab_size": "None: the data's vocabulary (256 bytes, data.bpe_vocab_size, or 50257 for .bin shards)",
    "max_len": "follows train.seq_len unless set",
}
# Sentinels of configs saved before None was used (checkpoints keep their config as JSON): (section, field) -> old value.
LEGACY_NONE = {("model", "vocab_size"): 0, ("model", "ssmax_s_init"): -1, ("data", "eos_id"): -1}


@dataclasses.dataclass(frozen=True)
class Config:
    """A whole run; `source` is the command line's config as plain JSON (saved with checkpoints)."""

    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    mesh: MeshConfig
    checkpoint: CheckpointConfig
    init: InitConfig
    source: dict


def _section(cls, values: dict):
    """cls from a section's values; a field the values lack (saved before it existed) takes its default."""
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})


def _model(cfg_model, cfg_data: DataConfig) -> ModelConfig:
    """The typed model; vocab_size None takes the data's vocabulary."""
    fields = {f.name: cfg_model[f.name] for f in dataclasses.fields(ModelConfig) if f.name in cfg_model}
    fields["attention_options"] = dict(fields.get("attention_options", {}))
    if fields.get("vocab_size") is None:
        fields["vocab_size"] = data.vocab_size(cfg_data)
    try:
        return ModelConfig(**fields)
    except ConfigError as e:
        raise ConfigError(f"config.{e}") from None
    except TypeError as e:  # a missing field
        raise ConfigError(f"config.model: {e}") from None


def to_json(cfg: ml_collections.ConfigDict) -> dict:
    """The ConfigDict as plain JSON types (tuples become lists)."""
    return json.loads(json.dumps(cfg.to_dict()))


def upgrade(saved: dict) -> dict:
    """A saved config with the sentinels of older versions (vocab_size 0, ssmax_s_init -1, eos_id -1) as None."""
    saved = json.loads(json.dumps(saved))
    for (section, name), old in LEGACY_NONE.items():
        if saved.get(section, {}).get(name) == old:
            saved[section][name] = None
    return saved


def from_json(d: dict) -> ml_collections.ConfigDict:
    """A saved config back as a ConfigDict (JSON lists become tuples where the config uses tuples)."""
    cfg = ml_collections.ConfigDict(upgrade(d))
    cfg.mesh.shape = tuple(cfg.mesh.shape)
    cfg.mesh.rules = tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in cfg.mesh.rules)
    return cfg


def parse(cfg: ml_collections.ConfigDict, *, reads_data: bool = True) -> Config:
    """The typed configs of a run; raises ConfigError for the first invalid field (before any data is read).

    reads_data=False: for a program that reads no data (freeatten-compile), data.path may be empty."""
    cfg = cfg.copy_and_resolve_references()
    sections = {name: cfg[name].to_dict() if name in cfg else {} for name in SECTIONS if name != "model"}  # saved before init
    if sections["data"].get("val_path"):
        sections["data"].pop("val_fraction", None)  # held out in its own files: unchecked (and unused)
    for name, values in sections.items():
        validate(SECTIONS[name], values, f"config.{name}.")
    if cfg.train.batch_size % cfg.train.grad_accum_steps:
        raise ConfigError(
            f"config.train.batch_size={cfg.train.batch_size} must be divisible by "
            f"config.train.grad_accum_steps={cfg.train.grad_accum_steps}"
        )
    if reads_data and cfg.data.source in FILE_SOURCES and not cfg.data.path:
        raise ConfigError(f"config.data.path is empty; data.source={cfg.data.source!r} needs {FILE_SOURCES[cfg.data.source]}")
    files = [f"data.{name}" for name in ("path", "val_path") if cfg.data.get(name)]
    if files and cfg.data.source not in FILE_SOURCES:
        raise ConfigError(
            f"config.{files[0]} is set but data.source={cfg.data.source!r} reads no files; set config.data.source to "
            "'text' (text files), 'bin' (.bin token shards) or 'hf' (a Hugging Face dataset: its name, or its .parquet, .arrow "
            "or .jsonl files)"
        )
    data_cfg, train = _section(DataConfig, cfg.data), _section(TrainConfig, cfg.train)
    return Config(
        model=_model(cfg.model, data_cfg),
        data=data_cfg,
        optim=_section(OptimConfig, cfg.optim),
        train=dataclasses.replace(train, profile_steps=tuple(train.profile_steps)),
        mesh=dataclasses.replace(
            _section(MeshConfig, cfg.mesh), shape=tuple(cfg.mesh.shape), rules=tuple(tuple(rule) for rule in cfg.mesh.rules)
        ),
        checkpoint=_section(CheckpointConfig, cfg.checkpoint),
        init=_section(InitConfig, sections["init"]),
        source=to_json(cfg),
    )
