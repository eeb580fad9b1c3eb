"""KV-cache decoding: chunked prefill + one token at a time equals the full forward pass for every
variant (so N_i follows the absolute cache position), also with packed documents; sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from freeatten_jax import attention
from freeatten_jax.nn import Transformer, preset
from freeatten_jax.nn.decoding import generate, prefill, sample

VARIANTS = list(attention.VARIANTS)
PROMPT, CHUNK, STEPS = 16, 8, 8  # a prompt of two chunks, then single-token steps
IMPLEMENTATION_OPTIONS = {"reference": {}, "blockwise": {"block_q": 8, "block_k": 8}}  # blocks shorter than the prompt
IMPLEMENTATIONS = [name for name in IMPLEMENTATION_OPTIONS if name in attention.IMPLEMENTATIONS]
# every variant on the reference; on blockwise one per family of rules that keeps N_i (ssmax: softmax's with a scale)
IMPLEMENTATION_VARIANTS = {"reference": VARIANTS, "blockwise": ["ssmax", "lssa", "lssar", "sigmoid"]}


def _cfg(variant="softmax", num_layers=1, **overrides):
    return preset(
        "tiny",
        num_layers=num_layers,
        d_model=32,
        num_heads=4,
        num_kv_heads=2,
        mlp_dim=64,
        vocab_size=50,
        max_len=16,
        attention=variant,
        use_bias=True,
        **overrides,
    )


def _models(implementation, variants=None):
    models = [Transformer(_cfg(variant), rngs=nnx.Rngs(0)) for variant in variants or IMPLEMENTATION_VARIANTS[implementation]]
    for model in models:
        model.set_implementation(implementation, **IMPLEMENTATION_OPTIONS[implementation])
    return models


@nnx.jit
def _full(models, tokens, positions, segments):
    return [m(tokens, positions_BT=positions, segment_ids_BT=segments) for m in models]


@nnx.jit
def _incremental(models, tokens, positions, segments):
    """Prefill PROMPT tokens in chunks of CHUNK, then decode one token per step (a scan)."""
    take = lambda x, part: None if x is None else x[:, part]
    outputs = []
    for model in models:
        cache = model.init_cache(tokens.shape[0], PROMPT + STEPS)
        part = slice(0, PROMPT)
        logits, cache = prefill(
            model, tokens[:, part], cache, chunk=CHUNK, positions_BT=take(positions, part), segment_ids_BT=take(segments, part)
        )

        def step(cache, xs, model=model):
            token, position, segment = xs
            step_logits, cache = model(token[:, None], positions_BT=position, segment_ids_BT=segment, cache=cache)
            return cache, step_logits[:, 0]

        rest = lambda x: None if x is None else jnp.swapaxes(x[:, PROMPT:, None], 0, 1)
        _, step_logits = jax.lax.scan(step, cache, (rest(tokens)[..., 0], rest(positions), rest(segments)))
        outputs.append(jnp.concatenate([logits, jnp.swapaxes(step_logits, 0, 1)], axis=1))
    return outputs


def _tokens(b=2):
    return jax.random.randint(jax.random.key(7), (b, PROMPT + STEPS), 0, 50)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_incremental_decoding_equals_full_forward(implementation):
    """Row 0 is one document at positions 0..23. Row 1 packs two: document 1 ends at position 2,
    document 2 restarts at 0 and continues through the prompt into the steps, so N_i must restart
    with it in the cache exactly as in the packed forward pass and as for the document alone."""
    models, tokens = _models(implementation), _tokens()
    variants = IMPLEMENTATION_VARIANTS[implementation]
    segments = jnp.array([[0] * 24, [0] * 3 + [1] * 21])
    positions = jnp.array([list(range(24)), list(range(3)) + list(range(21))])
    full = _full(models, tokens, positions, segments)
    incremental = _incremental(models, tokens, positions, segments)
    alone = _full(models, tokens[1:, 3:], None, None)  # document 2 on its own, default positions
    for variant, f, i, a in zip(variants, full, incremental, alone, strict=True):
        np.testing.assert_allclose(i, f, atol=2e-5, err_msg=variant)
        np.testing.assert_allclose(i[1:, 3:], a, atol=2e-5, err_msg=variant)


def test_sample_greedy_top_k_and_temperature():
    logits = jnp.array([[0.0, 3.0, 1.0, 2.9], [5.0, -1.0, 4.0, 0.0]])
    np.testing.assert_array_equal(sample(logits, jax.random.key(0), 0.0, None), [1, 0])
    keys = jax.random.split(jax.random.key(0), 200)
    top2 = jnp.stack([sample(logits, k, 1.0, 2) for k in keys])
    assert set(np.asarray(top2[:, 0]).tolist()) == {1, 3} and set(np.asarray(top2[:, 1]).tolist()) == {0, 2}
    for k in keys[:20]:
        np.testing.assert_array_equal(sample(logits, k, 1.0, 1), [1, 0])  # top-1 is greedy
    cold = jnp.stack([sample(logits, k, 0.01, None) for k in keys[:50]])
    hot = jnp.stack([sample(logits, k, 100.0, None) for k in keys])
    assert np.all(np.asarray(cold) == [1, 0]) and len(set(np.asarray(hot[:, 0]).tolist())) == 4


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05], [0.05, 0.05, 0.1, 0.8]]))
    keys = jax.random.split(jax.random.key(1), 300)
    drawn = np.asarray(jnp.stack([sample(logits, k, 1.0, None, 0.75) for k in keys]))
    assert set(drawn[:, 0].tolist()) == {0, 1} and set(drawn[:, 1].tolist()) == {3}  # 0.5 + 0.3 >= 0.75; 0.8 alone
    assert 0.55 < np.mean(drawn[:, 0] == 0) < 0.70  # renormalised: 0.5 / 0.8
    wide = np.asarray(jnp.stack([sample(logits, k, 1.0, None, 0.9) for k in keys]))
    assert set(wide[:, 0].tolist()) == {0, 1, 2}
    both = np.asarray(jnp.stack([sample(logits, k, 1.0, 1, 0.99) for k in keys[:20]]))
    assert np.all(both == [0, 3])  # top-k applies too


def test_generation_stops_at_eos_and_pads_finished_rows():
    model = Transformer(_cfg("lssar", num_layers=2), rngs=nnx.Rngs(0))
    prompt = _tokens()[:, :PROMPT]
    free = np.asarray(generate(model, prompt, 6, temperature=0.0))[:, PROMPT:]
    eos = int(free[0, 1])
    stopped = np.asarray(generate(model, prompt, 6, temperature=0.0, eos_id=eos))[:, PROMPT:]
    for row_free, row in zip(free, stopped):
        hits = np.flatnonzero(row_free == eos)
        if hits.size:  # identical up to the first eos, then only eos
            end = hits[0] + 1
            np.testing.assert_array_equal(row[:end], row_free[:end])
            assert np.all(row[end:] == eos)
        else:
            np.testing.assert_array_equal(row, row_free[: len(row)])
    if all((row == eos).any() for row in free):
        assert stopped.shape[1] < 6 or np.all(stopped[:, -1] == eos)


def test_generate_greedy_follows_the_model_and_sampling_is_seeded():
    model = Transformer(_cfg("lssar", num_layers=2), rngs=nnx.Rngs(0))  # one cache per layer
    prompt = _tokens()[:, :PROMPT]
    greedy = generate(model, prompt, 6, temperature=0.0, prefill_chunk=CHUNK)
    assert greedy.shape == (2, PROMPT + 6)
    np.testing.assert_array_equal(greedy[:, :PROMPT], prompt)
    logits = nnx.jit(lambda m, t: m(t))(model, greedy[:, :-1])
    np.testing.assert_array_equal(jnp.argmax(logits[:, PROMPT - 1 :], axis=-1), greedy[:, PROMPT:])
    a, b, c = (generate(model, prompt, 6, temperature=2.0, seed=s) for s in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_generate_reports_each_steps_tokens_to_on_token():
    model, prompt = Transformer(_cfg("lssar", num_layers=1), rngs=nnx.Rngs(0)), _tokens()[:, :4]
    seen = []
    out = generate(model, prompt, 4, temperature=0.0, on_token=seen.append)
    assert len(seen) == 4 and all(t.shape == (prompt.shape[0],) for t in seen)
    np.testing.assert_array_equal(np.stack(seen, axis=1), np.asarray(out)[:, prompt.shape[1] :])


def test_generate_uses_eval_mode_without_changing_the_callers_model():
    model = Transformer(_cfg("ssmax", dropout=0.5), rngs=nnx.Rngs(0))
    prompt = _tokens()[:, :4]
    first, second = generate(model, prompt, 3, temperature=0.0), generate(model, prompt, 3, temperature=0.0)
    np.testing.assert_array_equal(first, second)  # no dropout while generating
    assert model.blocks[0].dropout.deterministic is False  # the caller's model is still training
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, prompt, 0)


@nnx.jit
def _prefill_then_default_positions(models, tokens, positions, segments):
    """Prefill PROMPT tokens with explicit positions and segments, then decode one token per step with neither."""
    outputs = []
    for model in models:
        cache = model.init_cache(tokens.shape[0], PROMPT + STEPS)
        logits, cache = prefill(
            model, tokens[:, :PROMPT], cache, positions_BT=positions[:, :PROMPT], segment_ids_BT=segments[:, :PROMPT]
        )

        def step(cache, token_B, model=model):
            step_logits, cache = model(token_B[:, None], cache=cache)
            return cache, step_logits[:, 0]

        _, step_logits = jax.lax.scan(step, cache, jnp.swapaxes(tokens[:, PROMPT:], 0, 1))
        outputs.append(jnp.concatenate([logits, jnp.swapaxes(step_logits, 0, 1)], axis=1))
    return outputs


def test_default_position_decoding_continues_an_explicit_position_prefill():
    """After a prefill with explicit positions (row 0 a document resumed at position 5, row 1 two packed
    documents), tokens decoded with default positions continue each row's last position and document,
    exactly as the full forward pass over prompt + generated tokens with those positions (the positions are the
    layer's, the same for every variant: two of them)."""
    models, tokens = _models("reference", ["ssmax", "lssar"]), _tokens()
    positions = jnp.array([list(range(5, 5 + 24)), list(range(3)) + list(range(21))])
    segments = jnp.array([[0] * 24, [0] * 3 + [1] * 21])
    full = _full(models, tokens, positions, segments)
    decoded = _prefill_then_default_positions(models, tokens, positions, segments)
    for variant, d, f in zip(["ssmax", "lssar"], decoded, full, strict=True):
        np.testing.assert_allclose(d, f, atol=2e-5, err_msg=variant)
