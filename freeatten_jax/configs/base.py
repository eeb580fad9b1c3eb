"""The training config of a variant and a size: the typed sections' defaults (training/config.py, where every field
is described; `freeatten-train --help` lists them), the size's model and its training settings."""

import ml_collections

from freeatten_jax import attention
from freeatten_jax.nn import presets
from freeatten_jax.training import config_defaults

# Per-size training settings (the papers' for the GPT-2-sized models, docs/method.md §5).
TRAINING = {
    "tiny": {},
    "gpt2_small": {
        "train.seq_len": 1024,
        "train.batch_size": 512,
        "train.steps": 18865,
        "optim.lr": 6e-4,
        "optim.warmup_steps": 1000,
        "data.source": "bin",
        "train.log_every": 10,
        "train.eval_every": 500,
        "train.checkpoint_every": 500,
    },
    "ssmax_162m": {
        "train.seq_len": 1024,
        "train.batch_size": 2048,
        "train.steps": 20000,
        "optim.lr": 6e-4,
        "optim.warmup_steps": 1000,
        "optim.schedule": "constant",
        "data.source": "bin",
        "train.log_every": 10,
        "train.eval_every": 500,
        "train.checkpoint_every": 500,
    },
}


def _frozen_temperature(cfg: ml_collections.ConfigDict) -> None:
    """LSSA / LSSAR's temperature log(d) log(N_i) frozen at log(d) log(T_train) for every row (following
    train.seq_len, as model.max_len does)."""
    cfg.model.attention_options.temperature_length = cfg.train.get_ref("seq_len").to_float()


# Named controls: another variant with fixed settings: the softmax_logn control (SSMax with s frozen at 1/log T_train)
# and the frozen-temperature LSSA / LSSAR (docs/method.md §2).
CONTROLS = {
    "softmax_logn": ("ssmax", {"model.ssmax_learn_s": False}),
    "lssa_fixed": ("lssa", _frozen_temperature),
    "lssar_fixed": ("lssar", _frozen_temperature),
}


def get_config(variant: str = "softmax", size: str = "tiny", init: str = "") -> ml_collections.ConfigDict:
    """The ConfigDict of `variant` (or a control) at `size` (an unknown variant is left for validation to name); with
    `init`, a warm start from that source, its model sizes, tokenizer and training length in place of the size's."""
    variant, settings = CONTROLS.get(variant, (variant, {}))
    defaults = attention.VARIANTS[variant].defaults if variant in attention.VARIANTS else {}
    cfg = config_defaults.build(presets.preset(size), defaults)
    cfg.model.attention = variant
    cfg.update_from_flattened_dict(TRAINING[size])
    if callable(settings):
        settings(cfg)
    else:
        cfg.update_from_flattened_dict(settings)
    if init:
        from freeatten_jax.training import warm_start

        cfg.update_from_flattened_dict(warm_start.settings(init))
    return cfg
