"""What several test files share: random attention inputs and their comparison, the tiny training config and its
corpus, a simulated preemption, Hugging Face's RoPE frequencies written from their definitions, and a tiny Hugging Face
Llama folder. Test files import from here, never from each other.

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim. The application (and filelock) is imported
where it is used: the kernel tests also run on a device machine that has only jax, flax, optax and orbax.
"""

import json
import os
import pathlib
import signal
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from freeatten_jax import attention

# float32 paths differ only in summation order; bfloat16 inputs by one rounding of outputs and gradients
TOLERANCE = {jnp.float32: 1e-4, jnp.bfloat16: 2e-2}
# Pallas in interpret mode unless FREEATTEN_PALLAS_INTERPRET=0 (benchmarks/device_check.py: the real kernels on a GPU)
INTERPRET = os.environ.get("FREEATTEN_PALLAS_INTERPRET", "1") != "0"


def subprocess_env(host_devices: int, optimised: bool = False, **variables) -> dict:
    """os.environ for a child process with `host_devices` CPU devices (not the suite's 8), keeping the session's cache
    and, unless `optimised` (a child that runs more than it compiles, e.g. an evaluation), its cheap compile flags
    (tests/conftest.py), plus `variables`."""
    flags = os.environ.get("XLA_FLAGS", "").replace("device_count=8", f"device_count={host_devices}")
    if optimised:
        flags = " ".join(f for f in flags.split() if f.startswith("--xla_force_host_platform_device_count"))
    return {**os.environ, "XLA_FLAGS": flags, **variables}


def key(*names):
    """A PRNG key named by the test's case, so each case draws fresh inputs of its own."""
    return jax.random.key(zlib.crc32("/".join(names).encode()))


def inputs(rng, b, t, s, h, kv_heads, d, dtype=jnp.float32):
    """q_BTHD, k_BSKD, v_BSKD and a cotangent g_BTHD, standard normal."""
    kq, kk, kv, kg = jax.random.split(rng, 4)
    q_BTHD = jax.random.normal(kq, (b, t, h, d), dtype)
    k_BSKD = jax.random.normal(kk, (b, s, kv_heads, d), dtype)
    v_BSKD = jax.random.normal(kv, (b, s, kv_heads, d), dtype)
    return q_BTHD, k_BSKD, v_BSKD, jax.random.normal(kg, (b, t, h, d), dtype)


def one_per_family() -> tuple[str, ...]:
    """The first registered variant of each family of row rules (the fast paths run a family's rules: ssmax runs
    softmax's with a scale, relu the un-normalised family's with another weight)."""
    first = {}
    for variant in attention.VARIANTS:
        first.setdefault(attention.get_variant(variant).normalise, variant)
    return tuple(first.values())


def variant_params(variant: str, h: int):
    """The differentiable variant options the tests use (ssmax's per-head s, and b)."""
    return {"s": jnp.linspace(0.6, 1.4, h), "b": jnp.float32(0.1)} if variant == "ssmax" else {}


def walk_eqns(jaxpr):
    """Every equation of a jaxpr and of the jaxprs inside it (loops, branches, shard_map, Pallas kernels), depth first."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from walk_eqns(inner)


def kernel_operand_widths(fn, *args) -> set[int]:
    """The last dims of the [B, heads, L, D] operands and results (4-d, neither of the last two 1: not a lane-dense
    row) of every Pallas call in fn."""
    eqns = [eqn for eqn in walk_eqns(jax.make_jaxpr(fn)(*args).jaxpr) if eqn.primitive.name == "pallas_call"]
    avals = [x.aval for eqn in eqns for x in (*eqn.invars, *eqn.outvars)]
    return {aval.shape[-1] for aval in avals if aval.ndim == 4 and min(aval.shape[-2:]) > 1}


def jit_call(f, *args):
    """f(*args) under jax.jit (conftest makes the session's compiles cheap)."""
    return jax.jit(f)(*args)


def compiled_value_and_grads(q, k, v, g, params, implementation_options, attend=attention.attend, **options):
    """The compiled map (q, k, v, g, params) -> (output, vjp of g w.r.t. q, k, v and `params`) of `attend`."""

    def run(q, k, v, params):
        return attend(q, k, v, **params, **options, **implementation_options)

    def both(q, k, v, g, params):
        out, vjp = jax.vjp(run, q, k, v, params)
        return out, vjp(g)

    return jax.jit(both).lower(q, k, v, g, params).compile()


def value_and_grads(q, k, v, g, params, implementation_options, attend=attention.attend, **options):
    return compiled_value_and_grads(q, k, v, g, params, implementation_options, attend, **options)(q, k, v, g, params)


_REFERENCE_RESULTS = {}


def _reference_value_and_grads(*args, **options):
    """value_and_grads of the reference, computed once per process for the same inputs and options (implementations
    that test the same case, e.g. every kernel on the block edges, share its reference)."""
    leaves, tree = jax.tree.flatten((args, options))
    arrays = [np.asarray(x) for x in leaves]
    name = (str(tree), tuple((x.dtype.name, x.shape, x.tobytes()) for x in arrays))
    if name not in _REFERENCE_RESULTS:
        _REFERENCE_RESULTS[name] = value_and_grads(*args, dict(implementation="reference"), **options)
    return _REFERENCE_RESULTS[name]


def compare(
    q,
    k,
    v,
    g,
    params,
    implementation_options,
    tolerance,
    check_params=True,
    attend=attention.attend,
    params_tolerance=None,
    **options,
):
    """`attend` with implementation_options: output and gradients (of `params` too if check_params, to
    params_tolerance if given) equal the reference's; returns the output."""
    out, grads = value_and_grads(q, k, v, g, params, implementation_options, attend, **options)
    out_ref, grads_ref = _reference_value_and_grads(q, k, v, g, params, **options)
    assert out.dtype == q.dtype
    assert_close(out, out_ref, tolerance, "output")
    tolerances = [tolerance] * 3 + [params_tolerance or tolerance]
    for name, got, want, tol in zip(["dq", "dk", "dv", "params"][: 4 if check_params else 3], grads, grads_ref, tolerances):
        assert_trees_close(got, want, tol, name)
    return out


def assert_close(got, want, tolerance, what):
    """Finite, and within tolerance x the largest |want| (at least 1e-3) everywhere."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.all(np.isfinite(got)), what
    scale = max(float(np.max(np.abs(want))), 1e-3)
    error = float(np.max(np.abs(got - want)))
    assert error <= tolerance * scale, f"{what}: max error {error:.3g} vs scale {scale:.3g}"


def assert_trees_close(got, want, tolerance, what):
    """assert_close leaf by leaf, naming the leaf that differs."""
    for (path, leaf), leaf_ref in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True):
        assert_close(leaf, leaf_ref, tolerance, f"{what}{jax.tree_util.keystr(path)}")


WORDS = "the king queen lord lady sword crown love death night day speak hear what thou thee art good ill".split()


def write_corpus(root: pathlib.Path) -> str:
    """Two files of pseudo-English lines (word spellings, spaces, line breaks to learn), written once however many
    processes ask; their glob."""
    import filelock

    root.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(root) + ".lock"):
        rng = np.random.default_rng(0)
        for name in ("a", "b"):
            lines = [" ".join(rng.choice(WORDS, rng.integers(4, 9))) + "." for _ in range(600)]
            if not (root / f"{name}.txt").exists():
                (root / f"{name}.txt").write_text("\n".join(lines))
    return str(root / "*.txt")


def read_metrics(workdir) -> list[dict]:
    """The rows of WORKDIR/metrics.jsonl (local or gs://); every line must be whole JSON, as a run's writer leaves it."""
    from freeatten_jax.training import storage

    return [json.loads(line) for line in (storage.path(workdir) / "metrics.jsonl").read_text().splitlines()]


def tiny_config(variant, text_glob, **overrides):
    """A one-layer, 32-wide model on the corpus: 6 steps of batch 8 x 16 tokens, validation at steps 3 and 6."""
    from freeatten_jax.configs import base

    cfg = base.get_config(variant, "tiny")
    cfg.update_from_flattened_dict(
        {
            "model.num_layers": 1,
            "model.d_model": 32,
            "model.num_heads": 2,
            "model.mlp_dim": 64,
            "data.source": "text",
            "data.path": text_glob,
            "train.seq_len": 16,
            "train.batch_size": 8,
            "train.steps": 6,
            "train.log_every": 1,
            "train.eval_every": 3,
            "train.eval_windows": 16,
            "train.checkpoint_every": 100,
            "optim.lr": 1e-2,
            "optim.warmup_steps": 2,
            "mesh.shape": (1, 1, 1),
            **overrides,
        }
    )
    return cfg


class SigtermAtBatch:
    """Sends SIGTERM to this process while the training loop fetches batch `n` (a simulated preemption)."""

    def __init__(self, n):
        from freeatten_jax.training import distributed

        self.n, self.calls, self.inner = n, 0, distributed.host_local_batch_to_global

    def __call__(self, *args):
        self.calls += 1
        if self.calls == self.n:
            os.kill(os.getpid(), signal.SIGTERM)
        return self.inner(*args)


def hf_inverse_frequencies(head_dim: int, rope_theta: float, rope_type: str = "default", **fields) -> np.ndarray:
    """Hugging Face's RoPE inverse frequencies in float64, written from the definitions in transformers'
    modeling_rope_utils (default theta^(-2f/D); linear: / factor; llama3: by wavelength, three bands), for the
    rope_parameters of a config.json (rope_theta, rope_type and the scaling's fields)."""
    inv_freq = rope_theta ** (-np.arange(0, head_dim, 2) / head_dim)
    if rope_type == "linear":
        return inv_freq / fields["factor"]
    if rope_type != "llama3":
        return inv_freq
    factor, low, high = fields["factor"], fields["low_freq_factor"], fields["high_freq_factor"]
    original = fields["original_max_position_embeddings"]
    scaled = []
    for f in inv_freq:
        wavelen = 2 * np.pi / f
        if wavelen > original / low:
            scaled.append(f / factor)
        elif wavelen < original / high:
            scaled.append(f)
        else:
            smooth = (original / wavelen - low) / (high - low)
            scaled.append((1 - smooth) * f / factor + smooth * f)
    return np.array(scaled)


# the tiny Llama of the Hugging Face import and export tests (LlamaConfig's fields but the vocabulary)
HUB = dict(
    architectures=["LlamaForCausalLM"],
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)


def hub_tokenizer(text_glob):
    """A byte-level BPE of 300 tokens (a `tokenizers.Tokenizer`) fitted on the test corpus."""
    import glob

    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([open(p).read() for p in sorted(glob.glob(text_glob))], trainer=trainer)
    return tok


def hub_tensors(params) -> dict[str, np.ndarray]:
    """A FlaxLlama's parameters under the Hub's torch names: `a.b.kernel` [in, out] -> `a.b.weight` [out, in]."""
    tensors = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        names = [k.key for k in path]
        leaf = np.asarray(leaf)
        if names[-1] == "kernel":
            leaf = leaf.T
        tensors[".".join(names[:-1] + ["weight"])] = np.ascontiguousarray(leaf)
    return tensors


def write_hub_folder(folder, reference, tok, shards: int = 1):
    """A Hugging Face folder of the FlaxLlama `reference` and the tokenizer `tok`: config.json, tokenizer.json and the
    weights as one model.safetensors or `shards` files with their index."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(reference.config.to_json_string())
    (folder / "tokenizer.json").write_text(tok.to_str())
    tensors = hub_tensors(reference.params)
    if shards == 1:
        save_file(tensors, folder / "model.safetensors")
        return folder
    names, weight_map = sorted(tensors), {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: tensors[n] for n in part}, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def import_hub(run_cli, folder, workdir, text_glob) -> list[str]:
    """freeatten-import of the Hub folder into `workdir`, the test corpus as its data; its output lines (it succeeded)."""
    from freeatten_jax.cli import import_hf

    on_text = ["--config.mesh.shape=(1,1,1)", "--config.data.source=text", f"--config.data.path={text_glob}"]
    code, lines = run_cli(import_hf.main, str(folder), f"--workdir={workdir}", *on_text)
    assert code == 0, lines
    return lines
