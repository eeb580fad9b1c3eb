"""The training config: the ml_collections `ConfigDict` of the command line, turned into typed, frozen
configs by `parse` (the only place that reads a ConfigDict). Errors are one line naming the field."""
import codecs
import dataclasses
import json
import math
from typing import Any, Callable

import ml_collections

from freeatten_jax import attention, data
from freeatten_jax.errors import ConfigError
from freeatten_jax.nn.config import ModelConfig
from freeatten_jax.training import optim


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: str  # data.SOURCES
    path: str
    val_path: str
    tokenizer: str  # data.TOKENIZERS
    bpe_vocab_size: int
    val_fraction: float
    cache_dir: str
    num_workers: int
    document_masking: str = "off"  # data.DOCUMENT_MASKING: auto (on for .bin shards) | on | off
    eos_id: int = -1  # the token opening each document; -1: the source's (data.document_eos)
    encoding: str = "utf-8"  # of text files (source=text)
    errors: str = "strict"  # on bytes the encoding rejects: strict (an error naming the file and offset) | replace | ignore
    tokenizer_path: str = ""  # a Hugging Face tokenizer.json for .bin shards (passkey, generation)
    retrieval_fraction: float = 0.0  # fraction of training windows replaced by synthetic passkey sequences (data.retrieval)
    allow_changed: bool = False  # resume although the data files differ from the checkpoint's fingerprint of them


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float
    schedule: str  # optim.SCHEDULES
    warmup_steps: int
    min_lr_ratio: float
    b1: float
    b2: float
    eps: float
    weight_decay: float
    clip_norm: float


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int  # global, in sequences, per optimiser step
    seq_len: int
    grad_accum_steps: int
    seed: int
    log_every: int
    eval_every: int  # 0: only at the end
    eval_windows: int
    checkpoint_every: int
    profile_steps: tuple[int, ...] = ()  # () or (first, last): a profiler trace of those steps to WORKDIR/profile
    peak_tflops: float = 0.0  # per device, for MFU; 0: known for the device, else MFU is omitted
    spike_factor: float = 5.0  # divergence: loss above this x its running median ...; 0: only NaN/Inf stop a run
    spike_steps: int = 3  # ... for this many steps in a row (training.divergence)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    shape: tuple[int, ...]
    rules: tuple[tuple[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    max_to_keep: int  # the newest ones; the last confirmed checkpoint is kept as well
    async_save: bool
    allow_fresh_start: bool = False  # start from step 0 when every checkpoint in the workdir was bad (else an error)


@dataclasses.dataclass(frozen=True)
class Config:
    """A whole run; `source` is the command line's config as plain JSON (saved with checkpoints)."""

    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    mesh: MeshConfig
    checkpoint: CheckpointConfig
    source: dict


def _one_of(options) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in options), "one of " + ", ".join(map(repr, options))


def _int(low: int, high: int | None = None) -> tuple[Callable[[Any], bool], str]:
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)
    return ok, f"an integer >= {low}" + (f" and <= {high}" if high is not None else "")


def _number(ok, text) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and ok(v)), text


def _mesh_shape() -> tuple[Callable[[Any], bool], str]:
    ok = lambda v: isinstance(v, (tuple, list)) and len(v) in (3, 4) and all(isinstance(n, int) and (n >= 1 or n == -1) for n in v)
    return ok, "3 or 4 sizes (data, fsdp, tensor[, context]), each >= 1 or -1 for 'the rest', e.g. '(1,1,1)' or '(2,1,1,4)'"


def _profile_steps() -> tuple[Callable[[Any], bool], str]:
    ok = lambda v: isinstance(v, (tuple, list)) and (not v or len(v) == 2 and all(isinstance(n, int) for n in v) and 1 <= v[0] <= v[1])
    return ok, "() for none, or (first, last) steps with 1 <= first <= last, e.g. '(10,12)'"


def _known_encoding(name) -> bool:
    try:
        return isinstance(name, str) and bool(codecs.lookup(name))
    except LookupError:
        return False


_POSITIVE = _number(lambda v: v > 0, "a number > 0")
_FINITE_POSITIVE = _number(lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
_FRACTION = _number(lambda v: 0 <= v < 1, "a number in [0, 1)")
_BOOL = ((lambda v: isinstance(v, bool)), "True or False")

CHECKS = {  # non-model fields; ModelConfig checks its own
    "data.source": _one_of(tuple(data.SOURCES)),
    "data.tokenizer": _one_of(tuple(data.TOKENIZERS)),
    "data.bpe_vocab_size": _int(257, 65536),
    "data.val_fraction": _number(lambda v: 0 < v < 1, "a number in (0, 1): validation needs held-out data (or set data.val_path)"),
    "data.allow_changed": _BOOL,
    "data.num_workers": _int(0),
    "data.document_masking": _one_of(tuple(data.DOCUMENT_MASKING)),
    "data.eos_id": _int(-1, 65535),
    "data.encoding": (_known_encoding, "a Python codec name, e.g. 'utf-8' or 'latin-1'"),
    "data.errors": _one_of(("strict", "replace", "ignore")),
    "optim.lr": _FINITE_POSITIVE,
    "data.retrieval_fraction": _FRACTION,
    "optim.schedule": _one_of(tuple(optim.SCHEDULES)),
    "optim.warmup_steps": _int(0),
    "optim.min_lr_ratio": _FRACTION,
    "optim.weight_decay": _number(lambda v: v >= 0, "a number >= 0"),
    "optim.clip_norm": _POSITIVE,
    "train.steps": _int(1),
    "train.batch_size": _int(1),
    "train.seq_len": _int(1),
    "train.grad_accum_steps": _int(1),
    "train.seed": _int(0),
    "train.log_every": _int(1),
    "train.eval_every": _int(0),
    "train.eval_windows": _int(1),
    "train.checkpoint_every": _int(1),
    "train.profile_steps": _profile_steps(),
    "train.peak_tflops": _number(lambda v: v >= 0, "a number >= 0 (0: known for the device)"),
    "train.spike_factor": _number(lambda v: v == 0 or (math.isfinite(v) and v > 1), "0 (off) or a finite number > 1"),
    "train.spike_steps": _int(1),
    "checkpoint.max_to_keep": _int(1),
    "checkpoint.allow_fresh_start": _BOOL,
    "mesh.shape": _mesh_shape(),
}


def _section(cls, cfg, name: str):
    """cls from cfg[name]; a field with a default may be absent (configs saved before it existed)."""
    section = cfg[name]
    fields = dataclasses.fields(cls)
    missing = [f.name for f in fields if f.name not in section and f.default is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"config.{name}.{missing[0]} is missing")
    return cls(**{f.name: section[f.name] for f in fields if f.name in section})


def _model(cfg_model, cfg_data) -> ModelConfig:
    """The typed model; vocab_size 0 takes the data's vocabulary, ssmax_s_init -1 means 1/log(max_len)."""
    fields = {f.name: cfg_model[f.name] for f in dataclasses.fields(ModelConfig) if f.name in cfg_model}
    fields["attention_options"] = dict(fields.get("attention_options", {}))
    fields["vocab_size"] = fields.get("vocab_size") or data.vocab_size(cfg_data)
    if fields.get("ssmax_s_init") == -1:
        fields["ssmax_s_init"] = None
    try:
        model = ModelConfig(**fields)
        attention.variant_options(model.attention, model.attention_options, model.num_heads)
        return model
    except ConfigError as e:
        raise ConfigError(f"config.{e}") from None
    except ValueError as e:  # an option's value (lssar p <= 0 or NaN, ...)
        raise ConfigError(f"config.model.attention_options: {e}") from None
    except TypeError as e:  # a missing field
        raise ConfigError(f"config.model: {e}") from None


def to_json(cfg: ml_collections.ConfigDict) -> dict:
    """The ConfigDict as plain JSON types (tuples become lists)."""
    return json.loads(json.dumps(cfg.to_dict()))


def from_json(d: dict) -> ml_collections.ConfigDict:
    """A saved config back as a ConfigDict (JSON lists become tuples where the config uses tuples)."""
    cfg = ml_collections.ConfigDict(json.loads(json.dumps(d)))
    cfg.mesh.shape = tuple(cfg.mesh.shape)
    cfg.mesh.rules = tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in cfg.mesh.rules)
    return cfg


def _has(cfg, field: str) -> bool:
    section, name = field.split(".")
    return name in cfg[section]


def _get(cfg, field: str):
    for name in field.split("."):
        cfg = cfg[name]
    return cfg


def parse(cfg: ml_collections.ConfigDict) -> Config:
    """The typed configs of a run; raises ConfigError for the first invalid field (before any data is read)."""
    cfg = cfg.copy_and_resolve_references()
    for field, (ok, allowed) in CHECKS.items():
        if field == "data.val_fraction" and cfg.data.get("val_path"):
            continue  # held out in its own files
        if _has(cfg, field) and not ok(value := _get(cfg, field)):
            raise ConfigError(f"config.{field}={value!r} is invalid; allowed: {allowed}")
    if cfg.train.batch_size % cfg.train.grad_accum_steps:
        raise ConfigError(f"config.train.batch_size={cfg.train.batch_size} must be divisible by "
                          f"config.train.grad_accum_steps={cfg.train.grad_accum_steps}")
    if cfg.data.source in ("text", "bin") and not cfg.data.path:
        raise ConfigError(f"config.data.path is empty; data.source={cfg.data.source!r} needs a glob of files")
    train, data_cfg = _section(TrainConfig, cfg, "train"), _section(DataConfig, cfg, "data")
    return Config(
        model=_model(cfg.model, data_cfg),
        data=data_cfg,
        optim=_section(OptimConfig, cfg, "optim"),
        train=dataclasses.replace(train, profile_steps=tuple(train.profile_steps)),
        mesh=MeshConfig(tuple(cfg.mesh.shape), tuple(tuple(rule) for rule in cfg.mesh.rules)),
        checkpoint=_section(CheckpointConfig, cfg, "checkpoint"),
        source=to_json(cfg),
    )
