"""The command line's ml_collections ConfigDict, derived from the typed sections' fields: every field, its default,
None as a typed placeholder (so `--config.model.vocab_size=512` parses), dtypes by name."""

import dataclasses

import ml_collections
import numpy as np
from ml_collections.config_dict import placeholder

from freeatten_jax.nn.config import LEARNED_OPTIONS, ModelConfig
from freeatten_jax.schema import base_type
from freeatten_jax.training.config import SECTIONS


def _value(field: dataclasses.Field, value):
    if value is None:
        return placeholder(base_type(field.type))
    return value.name if isinstance(value, np.dtype) else value


def _section(cls, values: dict) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({f.name: _value(f, values[f.name]) for f in dataclasses.fields(cls)})


def _defaults(cls) -> dict:
    return {
        f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory() for f in dataclasses.fields(cls)
    }


def build(model: ModelConfig, variant_defaults: dict) -> ml_collections.ConfigDict:
    """The whole config: `model`'s fields (vocab_size None: the data's; max_len following train.seq_len), the variant's
    own options with their defaults (so `--config.model.attention_options.p=3` works), every other section's defaults."""
    cfg = ml_collections.ConfigDict(
        {name: _section(cls, _defaults(cls)) for name, cls in SECTIONS.items() if cls is not ModelConfig}
    )
    # an option left off (None: softmax's scale) is a number when given
    options = {k: placeholder(float) if v is None else v for k, v in variant_defaults.items() if k not in LEARNED_OPTIONS}
    cfg.model = _section(ModelConfig, {**dataclasses.asdict(model), "vocab_size": None, "attention_options": options})
    cfg.model.max_len = cfg.train.get_ref("seq_len")
    return cfg
