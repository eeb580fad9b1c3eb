"""Warm start (config.init.path): a new run whose model starts from the weights of a trained run or of a Hugging Face
Llama-family checkpoint (formats.hf_llama), with the attention this run configures.

Every parameter the two models share is copied, shapes checked. A parameter of this run's attention that the source
lacks starts at its value in NEW; one the source has and this run's attention does not (SSMax's s when switching to
softmax) is dropped. Any other difference (sizes, tied or untied embeddings, the vocabulary, the tokenizer) is one
UserError naming the first, raised before the run writes anything. The optimizer state, the learning-rate schedule,
the data order and the step start afresh, at 0; the run saves that state as checkpoint 0, and its resolved source in
WORKDIR/init.json, so it resumes like any run, without reading its source again.
"""

import dataclasses
import json
import math
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

from freeatten_jax.errors import UserError
from freeatten_jax.formats import hf_llama
from freeatten_jax.nn.config import ModelConfig
from freeatten_jax.training import run_dir, storage
from freeatten_jax.training import state as train_state

# The model fields a source fixes (the lm config's init= argument takes them from it); the others are this run's own.
ARCHITECTURE = (
    "vocab_size",
    "num_layers",
    "num_heads",
    "d_model",
    "mlp_dim",
    "num_kv_heads",
    "mlp",
    "norm",
    "norm_eps",
    "tie_embeddings",
    "use_bias",
    "qkv_bias",
    "window",
    "rope_theta",
    "rope_scaling",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_len",
    "dtype",
    "param_dtype",
)


def _initial_s(cfg, source) -> float:
    """SSMax's s: s log N = 1 at the source's training length (it starts as the source's softmax there), unless set."""
    return cfg.model.ssmax_s_init if cfg.model.ssmax_s_init is not None else 1.0 / math.log(source.training_length)


# Parameters of a variant that a source may lack (the last name of their path) -> their initial value
NEW = {"s_H": _initial_s, "b_H": lambda cfg, source: 0.0}


class WarmStartError(UserError, ValueError):
    """config.init.path names no usable source, or one whose model this run's cannot start from."""


@dataclasses.dataclass(frozen=True)
class Source:
    """A model to start from: `name` as recorded (WORKDIR@STEP or the Hub folder), its ModelConfig, the length it was
    trained at, its tokenizer (None if it has none), the data fields that tokenize as it did,
    `load() -> {parameter path: array}` in our layout, and where a source run's own weights came from (run_dir.origin:
    an import's Hub model, kept in the reports' labels of the runs started from it)."""

    name: str
    model: ModelConfig
    training_length: int
    tokenizer: object | None
    data_settings: dict
    load: Callable[[], dict[str, np.ndarray]]
    origin: str = ""


def _path_name(path) -> str:
    """`blocks.0.attn.wq_EHD` for a parameter's pytree path."""
    return ".".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def param_shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's path -> shape in a model of `model_cfg` (nothing allocated)."""
    params = nnx.state(nnx.eval_shape(train_state.builder(model_cfg, 0)), nnx.Param)
    return {_path_name(path): tuple(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(params)}


def flat_params(model) -> dict[str, np.ndarray]:
    """{parameter path: array} of a model's parameters, in the layout a Source loads."""
    return {_path_name(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))}


def _from_run(workdir: str, step: int | None) -> Source:
    """A run's checkpoint `step` (its latest for None)."""
    from freeatten_jax import data

    with run_dir.reading(workdir) as ckpt:
        steps = ckpt.all_steps()
        step = ckpt.require_latest() if step is None else step
        if step not in steps:
            raise WarmStartError(f"{workdir} has no checkpoint step {step}; it has: {', '.join(map(str, steps)) or 'none'}")
        with run_dir.damaged_in_one_line(ckpt, step):
            cfg = ckpt.run_config(step)
    load = lambda: flat_params(run_dir.load_params(workdir, step)[0])
    data_settings = {f"data.{name}": value for name, value in dataclasses.asdict(cfg.data).items()}
    tokenizer = data.run_tokenizer(workdir, cfg.data)
    return Source(f"{workdir}@{step}", cfg.model, cfg.train.seq_len, tokenizer, data_settings, load, run_dir.origin(workdir))


def _from_hub(folder: str) -> Source:
    """A Hugging Face Llama folder (config.json, model.safetensors or its shards, tokenizer.json), checked before loading."""
    hub = hf_llama.open_checkpoint(folder)
    data_settings = {"data.tokenizer": "file", "data.tokenizer_path": str(hub.folder / "tokenizer.json")}
    return Source(str(hub.folder), hub.model, hub.training_length, hf_llama.tokenizer(folder), data_settings, hub.load)


def open_source(text: str) -> Source:
    """The source config.init.path names: a Hub folder (it has config.json or Hub weights), else a run's WORKDIR[@STEP]."""
    path, step = run_dir.split_step(text)
    try:
        if any((storage.path(path) / name).exists() for name in hf_llama.MARKERS):
            return _from_hub(path)
        return _from_run(path, step)
    except UserError as e:
        raise WarmStartError(f"config.init.path={text}: {e}") from None


def settings(text: str) -> dict:
    """The config fields (flattened) of a warm start from `text` (the lm config's init= argument): the source's
    architecture, the data fields that tokenize as it did, its training length as train.seq_len, and init.path. Read
    while the command line's config loads, before absl's flags are parsed: orbax's read-only notices kept quiet."""
    with run_dir.quiet_orbax():
        source = open_source(text)
    plain = lambda value: value.name if isinstance(value, np.dtype) else value
    model = {f"model.{name}": plain(getattr(source.model, name)) for name in ARCHITECTURE}
    return {**model, **source.data_settings, "train.seq_len": source.training_length, "init.path": text}


def _tokenizer_json(tokenizer):
    """What identifies a tokenizer: its Hugging Face JSON ('byte' for the byte tokenizer, None for none)."""
    return None if tokenizer is None else json.loads(tokenizer.to_str()) if hasattr(tokenizer, "to_str") else "byte"


def check(cfg, source: Source, data_tokenizer) -> None:
    """Refuses a source whose vocabulary, tokenizer or parameters this run's model cannot start from."""
    where = f"config.init.path={cfg.init.path}"
    if source.model.vocab_size != cfg.model.vocab_size:
        raise WarmStartError(
            f"{where}: its vocabulary has {source.model.vocab_size} tokens but this run's has {cfg.model.vocab_size} "
            f"(model.vocab_size, the data's tokenizer); a warm start keeps the source's vocabulary"
        )
    theirs, ours = _tokenizer_json(source.tokenizer), _tokenizer_json(data_tokenizer)
    if theirs is not None and ours is not None and theirs != ours:
        raise WarmStartError(
            f"{where}: this run's data tokenizer (data.tokenizer={cfg.data.tokenizer}) is not the source's; tokenize "
            f"as the source did (a Hugging Face model's: data.tokenizer=file, data.tokenizer_path=its tokenizer.json)"
        )
    theirs, ours = param_shapes(source.model), param_shapes(cfg.model)
    for name in sorted(set(theirs) | set(ours)):
        if name in theirs and name in ours and theirs[name] != ours[name]:
            raise WarmStartError(
                f"{where}: parameter {name} is {theirs[name]} in the source but {ours[name]} in this run's model; "
                f"give this run the source's model sizes"
            )
        if name.rpartition(".")[2] not in NEW and (name in theirs) != (name in ours):
            side = "this run's model" if name in ours else "the source"
            raise WarmStartError(f"{where}: parameter {name} is only in {side}; give this run the source's model sizes")


def checked_source(cfg, data_tokenizer) -> Source:
    """config.init.path's source, after `check`."""
    source = open_source(cfg.init.path)
    check(cfg, source, data_tokenizer)
    return source


def apply(cfg, state: dict, source: Source, workdir) -> dict:
    """`state` with the source's parameters copied in (and NEW's initial values), each in its leaf's sharding and
    dtype; writes WORKDIR/init.json (process 0)."""
    arrays, shapes, new = source.load(), param_shapes(cfg.model), {}

    def put(path, leaf):
        name = _path_name(path)
        if name not in arrays:
            new[name] = NEW[name.rpartition(".")[2]](cfg, source)
        value = np.asarray(arrays.get(name, new.get(name)), dtype=leaf.dtype)
        value = np.broadcast_to(value, leaf.shape)
        return jax.make_array_from_callback(leaf.shape, leaf.sharding, lambda index: value[index])

    params = jax.tree_util.tree_map_with_path(put, state["params"])
    record = {
        "source": source.name,
        "training_length": source.training_length,
        "attention": cfg.model.attention,
        "source_variant": source.model.variant_name,
        "source_origin": source.origin,
        "copied": len(set(arrays) & set(shapes)),
        "new": new,
        "dropped": sorted(set(arrays) - set(shapes)),
    }
    if jax.process_index() == 0:
        storage.path(workdir).mkdir(parents=True, exist_ok=True)
        storage.write_atomic(storage.path(workdir) / run_dir.INIT_FILE, json.dumps(record, indent=1) + "\n")
        print(
            f"warm start from {source.name}: {record['copied']} parameters copied, {len(new)} new "
            f"({', '.join(sorted({n.rpartition('.')[2] for n in new})) or 'none'}), {len(record['dropped'])} dropped",
            flush=True,
        )
    return {**state, "params": params}


def has_checkpoint(workdir) -> bool:
    """Whether the workdir holds a checkpoint step (then the run resumes from it, not from its source)."""
    folder = storage.path(workdir) / "checkpoints"
    return folder.exists() and any(p.name.isdigit() for p in folder.iterdir())
