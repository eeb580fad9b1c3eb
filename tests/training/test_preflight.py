"""training/preflight.py's checks, called directly with tiny configs on the 8 forced host devices: the mesh a run
asks for, a batch that divides over its data-parallel devices, a sequence that splits over the context axis, and data
that fits the model's vocabulary and fills a training and a validation window."""

import numpy as np
import pytest
from helpers import tiny_config

from freeatten_jax import data
from freeatten_jax.errors import ConfigError
from freeatten_jax.training import config, preflight


def _cfg(text_glob, **overrides):
    return config.parse(tiny_config("lssa", text_glob, **overrides))


def _splits(train_tokens=1000, val_tokens=1000, vocab_size=256):
    return data.Splits([np.zeros(train_tokens, np.int32)], [np.zeros(val_tokens, np.int32)], vocab_size, None)


def test_a_single_process_takes_the_first_devices_its_mesh_needs_or_all_of_them_for_a_minus_one(text_glob):
    assert preflight.make_mesh(_cfg(text_glob, **{"mesh.shape": (2, 2, 1)})).devices.size == 4
    assert dict(preflight.make_mesh(_cfg(text_glob, **{"mesh.shape": (-1, 1, 1)})).shape)["data"] == 8
    with pytest.raises(ConfigError, match=r"^config.mesh.shape \(16, 1, 1, 1\) must give .* divide 8 devices"):
        preflight.make_mesh(_cfg(text_glob, **{"mesh.shape": (16, 1, 1)}))


def test_a_micro_batch_that_does_not_divide_over_the_data_parallel_devices_is_refused(text_glob):
    with pytest.raises(
        ConfigError,
        match=r"^config.train.batch_size=8 must be divisible by the 1 processes reading different rows, and each of its 2 "
        r"micro-batches \(4\) by the 8 data-parallel devices \(mesh data x fsdp\)$",
    ):
        preflight.make_mesh(_cfg(text_glob, **{"mesh.shape": (4, 2, 1), "train.grad_accum_steps": 2}))
    preflight.make_mesh(_cfg(text_glob, **{"mesh.shape": (2, 2, 2), "train.grad_accum_steps": 2}))


def test_a_sequence_that_does_not_split_into_zigzag_chunks_is_refused(text_glob):
    with pytest.raises(ConfigError, match=r"config.train.seq_len 12 must be a multiple of 2 x the 'context' axis size \(8\)"):
        preflight.make_mesh(_cfg(text_glob, **{"train.seq_len": 12, "mesh.shape": (2, 1, 1, 4)}))
    preflight.make_mesh(_cfg(text_glob, **{"train.seq_len": 16, "mesh.shape": (2, 1, 1, 4)}))


def test_data_must_fit_the_vocabulary_and_fill_a_training_and_a_validation_window(text_glob):
    cfg = _cfg(text_glob)  # seq_len 16: windows of 17 tokens, training's at random offsets (33 tokens hold one)
    preflight.check_data(cfg, _splits(train_tokens=33, val_tokens=17))
    with pytest.raises(ConfigError, match=r"^config.model.vocab_size=256 is smaller than the data's vocabulary \(300\); "):
        preflight.check_data(cfg, _splits(vocab_size=300))
    with pytest.raises(data.DataError, match=r"^the training data has 32 tokens: too few for 1 window\(s\) of .* = 17 tokens"):
        preflight.check_data(cfg, _splits(train_tokens=32))
    with pytest.raises(data.DataError, match=r"^the validation data has 16 tokens: too few for one window of .* = 17 tokens"):
        preflight.check_data(cfg, _splits(val_tokens=16))
