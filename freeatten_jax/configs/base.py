"""Shared training configuration; experiment files (softmax.py, lssar.py, ...) set the variant and size.

Every field can be overridden on the command line, e.g. `--config.train.steps=200`; model fields
and their allowed values: freeatten_jax.nn.config.ModelConfig.
"""
import dataclasses

import jax.numpy as jnp
import ml_collections

from freeatten_jax import attention
from freeatten_jax.nn import presets, sharding
from freeatten_jax.nn.config import LEARNED_OPTIONS


# Per-size training settings (the papers' for the GPT-2-sized models, docs/method.md §5).
TRAINING = {
    "tiny": {},
    "gpt2_small": {"train.seq_len": 1024, "train.batch_size": 512, "train.steps": 18865, "optim.lr": 6e-4, "optim.warmup_steps": 1000,
                   "data.source": "bin", "train.log_every": 10, "train.eval_every": 500, "train.checkpoint_every": 500},
    "ssmax_162m": {"train.seq_len": 1024, "train.batch_size": 2048, "train.steps": 20000, "optim.lr": 6e-4, "optim.warmup_steps": 1000,
                   "optim.schedule": "constant", "data.source": "bin", "train.log_every": 10, "train.eval_every": 500,
                   "train.checkpoint_every": 500},
}


def _model(size: str) -> ml_collections.ConfigDict:
    """The preset's ModelConfig as command-line fields (dtypes by name; ssmax_s_init -1 = 1/log(max_len))."""
    fields = dataclasses.asdict(presets.preset(size))
    fields.update(dtype=jnp.dtype(fields["dtype"]).name, param_dtype=jnp.dtype(fields["param_dtype"]).name, ssmax_s_init=-1.0)
    return ml_collections.ConfigDict(fields)


def get_config(variant: str = "softmax", size: str = "tiny") -> ml_collections.ConfigDict:
    cfg = ml_collections.ConfigDict()
    cfg.model = _model(size)
    cfg.model.attention = variant
    # the variant's own options with their defaults (lssar: p), so `--config.model.attention_options.p=3` works
    defaults = attention.VARIANTS[variant].defaults if variant in attention.VARIANTS else {}  # unknown: validation says so
    cfg.model.attention_options = {k: v for k, v in defaults.items() if k not in LEARNED_OPTIONS}
    cfg.model.vocab_size = 0  # 0: the data's vocabulary (256 bytes, data.bpe_vocab_size, or 50257 for .bin shards)
    cfg.mesh = ml_collections.ConfigDict()
    cfg.mesh.shape = (-1, 1, 1)  # ('data', 'fsdp', 'tensor'[, 'context']), e.g. (1, -1, 1) for FSDP; -1 fills the rest
    cfg.mesh.rules = sharding.DEFAULT_RULES  # logical axis -> mesh axes

    cfg.data = ml_collections.ConfigDict()
    cfg.data.source = "shakespeare"  # shakespeare (default corpus) | text (data.path glob) | bin (llm.c token shards)
    cfg.data.path = ""  # glob of text files or .bin training shards
    cfg.data.val_path = ""  # optional glob of .bin validation shards; else the last val_fraction of each file/shard
    cfg.data.tokenizer = "byte"  # byte | bpe (text sources; .bin shards are already tokenized)
    cfg.data.bpe_vocab_size = 4096
    cfg.data.val_fraction = 0.05
    cfg.data.cache_dir = ""  # default: $XDG_CACHE_HOME/freeatten_jax or ~/.cache/freeatten_jax
    cfg.data.num_workers = 0  # grain worker processes (0: load in the training process)
    cfg.data.document_masking = "auto"  # auto (on for .bin shards, off for text) | on | off: attention restarts per document
    cfg.data.eos_id = -1  # the token opening each document; -1: 50256 for .bin, a new token past the text tokenizer's
    cfg.data.encoding = "utf-8"  # of text files (source=text)
    cfg.data.errors = "strict"  # strict: undecodable bytes are an error naming the file and offset | replace | ignore
    cfg.data.retrieval_fraction = 0.0  # e.g. 0.25: that fraction of training windows are synthetic passkey sequences
    cfg.data.tokenizer_path = ""  # .bin shards: a Hugging Face tokenizer.json (e.g. GPT-2's) for passkey and generation
    cfg.data.allow_changed = False  # True: resume although the data files differ from those the checkpoint was trained on

    cfg.optim = ml_collections.ConfigDict()
    cfg.optim.lr = 3e-3
    cfg.optim.schedule = "cosine"  # cosine | constant (after linear warm-up)
    cfg.optim.warmup_steps = 50
    cfg.optim.min_lr_ratio = 0.1  # cosine floor, as a fraction of lr
    cfg.optim.b1 = 0.9
    cfg.optim.b2 = 0.95
    cfg.optim.eps = 1e-8
    cfg.optim.weight_decay = 0.1  # matrices only
    cfg.optim.clip_norm = 1.0

    cfg.train = ml_collections.ConfigDict()
    cfg.train.steps = 300
    cfg.train.batch_size = 32  # global, in sequences, per optimiser step
    cfg.train.seq_len = 64  # the training length (eval extrapolates from it)
    cfg.train.grad_accum_steps = 1  # micro-batches per step (batch_size must be divisible by it)
    cfg.train.seed = 0
    cfg.train.log_every = 25
    cfg.train.eval_every = 50  # 0: only at the end
    cfg.train.eval_windows = 64  # held-out windows of seq_len tokens per validation
    cfg.train.checkpoint_every = 100
    cfg.train.profile_steps = ()  # e.g. (10, 12): a jax.profiler trace of steps 10-12 to WORKDIR/profile
    cfg.train.peak_tflops = 0.0  # per-device peak for MFU; 0: known for the device (H100, A100, TPU v4-v6), else not shown
    cfg.train.spike_factor = 5.0  # divergence: stop when the loss is above this x its running median ...; 0: off
    cfg.train.spike_steps = 3  # ... for this many steps in a row; then roll back to the last confirmed checkpoint

    cfg.model.max_len = cfg.train.get_ref("seq_len")  # the training length (sets SSMax's initial s)
    cfg.update_from_flattened_dict(TRAINING[size])

    cfg.checkpoint = ml_collections.ConfigDict()
    cfg.checkpoint.max_to_keep = 3
    cfg.checkpoint.async_save = True
    cfg.checkpoint.allow_fresh_start = False  # True: start from step 0 when every checkpoint in the workdir is bad
    return cfg
