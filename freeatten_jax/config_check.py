"""Start-up validation of the training config: one clear line naming the field and its allowed values."""
from typing import Any, Callable

from freeatten_jax import attention, optim
from freeatten_jax.data import SOURCES, TOKENIZERS


class ConfigError(ValueError):
    """An invalid config field."""


def _one_of(options) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in options), "one of " + ", ".join(map(repr, options))


def _int(low: int, high: int | None = None) -> tuple[Callable[[Any], bool], str]:
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)
    return ok, f"an integer >= {low}" + (f" and <= {high}" if high is not None else "")


def _positive() -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, (int, float)) and v > 0), "a number > 0"


def _fraction() -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, (int, float)) and 0 <= v < 1), "a number in [0, 1)"


def _mesh_shape() -> tuple[Callable[[Any], bool], str]:
    ok = lambda v: isinstance(v, (tuple, list)) and len(v) == 3 and all(isinstance(n, int) and (n >= 1 or n == -1) for n in v)
    return ok, "3 sizes (data, fsdp, tensor), each >= 1 or -1 for 'the rest', e.g. '(1,1,1)'"


CHECKS = {
    "model.attention": _one_of(tuple(attention.VARIANTS)),
    "model.vocab_size": _int(0),
    "data.source": _one_of(tuple(SOURCES)),
    "data.tokenizer": _one_of(tuple(TOKENIZERS)),
    "data.bpe_vocab_size": _int(257, 65536),
    "data.val_fraction": _fraction(),
    "data.num_workers": _int(0),
    "optim.lr": _positive(),
    "optim.schedule": _one_of(tuple(optim.SCHEDULES)),
    "optim.warmup_steps": _int(0),
    "optim.min_lr_ratio": _fraction(),
    "optim.weight_decay": (lambda v: isinstance(v, (int, float)) and v >= 0, "a number >= 0"),
    "optim.clip_norm": _positive(),
    "train.steps": _int(1),
    "train.batch_size": _int(1),
    "train.seq_len": _int(1),
    "train.grad_accum_steps": _int(1),
    "train.seed": _int(0),
    "train.log_every": _int(1),
    "train.eval_every": _int(0),
    "train.eval_windows": _int(1),
    "train.checkpoint_every": _int(1),
    "checkpoint.max_to_keep": _int(1),
    "mesh.shape": _mesh_shape(),
}


def _get(cfg, field: str):
    for name in field.split("."):
        cfg = cfg[name]
    return cfg


def validate(cfg) -> None:
    """Raises ConfigError for the first invalid field."""
    for field, (ok, allowed) in CHECKS.items():
        if not ok(value := _get(cfg, field)):
            raise ConfigError(f"config.{field}={value!r} is invalid; allowed: {allowed}")
    if cfg.train.batch_size % cfg.train.grad_accum_steps:
        raise ConfigError(f"config.train.batch_size={cfg.train.batch_size} must be divisible by "
                          f"config.train.grad_accum_steps={cfg.train.grad_accum_steps}")
    if cfg.data.source in ("text", "bin") and not cfg.data.path:
        raise ConfigError(f"config.data.path is empty; data.source={cfg.data.source!r} needs a glob of files")
