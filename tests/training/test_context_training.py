"""Context parallelism in the model, trainer and eval on 8 forced host devices: the sequence sharded over
the mesh axis 'context' gives the same logits, losses and eval as one device, through the ring."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config

from freeatten_jax import attention
from freeatten_jax.errors import UserError
from freeatten_jax.evaluation import suite, switches
from freeatten_jax.nn import Transformer, preset, sharding
from freeatten_jax.training import loop

RULES = sharding.DEFAULT_RULES
SETTINGS = suite.Settings(multipliers=(1, 16), eval_tokens=2 * (16 * 16 + 1), passkey_depths=(), analysis_windows=1)


def _model(variant):
    cfg = preset(
        "tiny", num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=64, vocab_size=64, max_len=32, attention=variant
    )
    return Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.fixture
def ring_calls(monkeypatch):
    """Counts the layers' calls of context_parallel_attend (traced), so a silent fallback to `attend` fails."""
    calls = []
    real = attention.context_parallel_attend
    monkeypatch.setattr(
        attention, "context_parallel_attend", lambda *a, **k: calls.append({**k, "q_len": a[0].shape[1]}) or real(*a, **k)
    )
    return calls


@pytest.mark.parametrize("variant", ["lssar", "softmax"])
def test_forward_over_context_4_equals_the_unsharded_forward(variant, ring_calls):
    """Logits of a packed batch (segments, per-document positions) with data=2, context=4."""
    model = _model(variant)
    tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, 64)
    segments = jnp.array([[0] * 11 + [1] * 21, [0] * 32])
    positions = jnp.array([list(range(11)) + list(range(21)), list(range(32))])
    forward = nnx.jit(lambda m, t, p, s: m(t, positions_BT=p, segment_ids_BT=s))
    expected = forward(model, tokens, positions, segments)
    mesh = sharding.make_mesh((2, 1, 1, 4))
    graphdef, state = nnx.split(model)
    sharded = nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh, RULES)))
    with sharding.use_mesh(mesh, RULES):
        inputs = [jax.device_put(x, sharding.batch_sharding(mesh, RULES, x.shape)) for x in (tokens, positions, segments)]
        logits = forward(sharded, *inputs)
    assert [(c["axis_name"], c["batch_axis"]) for c in ring_calls] == [("context", "data")] * 2  # both layers
    assert {s.data.shape for s in logits.addressable_shards} == {(1, 8, 64)}  # batch over data, sequence over context
    np.testing.assert_allclose(logits, expected, atol=1e-5)


@pytest.mark.slow
def test_training_over_data_2_context_4_logs_the_losses_of_one_device(text_glob, tmp_path, ring_calls):
    losses = {}
    for shape in ((1, 1, 1), (2, 1, 1, 4)):
        cfg = tiny_config("lssar", text_glob, **{"train.steps": 5, "train.eval_every": 0, "mesh.shape": shape})
        losses[shape] = {m["step"]: m["loss"] for m in loop.train_and_evaluate(cfg, tmp_path / str(shape)) if "loss" in m}
        assert bool(ring_calls) == (len(shape) == 4)
    assert sorted(losses[(2, 1, 1, 4)]) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(losses[(2, 1, 1, 4)][5], losses[(1, 1, 1)][5], rtol=1e-5)
    np.testing.assert_allclose(list(losses[(2, 1, 1, 4)].values()), list(losses[(1, 1, 1)].values()), rtol=1e-5)


@pytest.mark.slow
def test_eval_at_16x_over_context_8_equals_single_device_eval(text_glob, tmp_path, ring_calls):
    workdir = str(tmp_path / "run")
    loop.train_and_evaluate(tiny_config("lssar", text_glob, **{"train.steps": 2, "train.eval_every": 0}), workdir)
    settings = dataclasses.replace(SETTINGS, context=8)
    single = suite.evaluate(workdir, switches.NONE, SETTINGS, suite.SplitCache())
    assert not ring_calls
    with pytest.raises(
        UserError,
        match=r"evaluation length 16 must be a multiple of 2 x the 'context' axis size \(6\).*change --multipliers or --context",
    ):
        suite.evaluate(workdir, switches.NONE, dataclasses.replace(SETTINGS, context=3), suite.SplitCache())
    sharded = suite.evaluate(workdir, switches.NONE, settings, suite.SplitCache())
    assert {(c["axis_name"], c["q_len"]) for c in ring_calls} == {("context", 16), ("context", 256)}
    assert [x.length for x in sharded.lengths] == [16, 256]  # 16 and 16x the training length
    for one, many in zip(single.lengths, sharded.lengths):
        np.testing.assert_allclose(many.loss, one.loss, rtol=1e-5)
        np.testing.assert_allclose(many.loss_last_train_len, one.loss_last_train_len, rtol=1e-5)
    np.testing.assert_allclose(sharded.per_position, single.per_position, rtol=1e-5, atol=1e-6)


def test_eval_refuses_more_context_devices_than_there_are_before_it_reads_the_run(tmp_path):
    with pytest.raises(UserError, match="--context=9 is invalid; allowed: 1 to the 8 devices"):
        suite.evaluate(str(tmp_path / "no run"), switches.NONE, dataclasses.replace(SETTINGS, context=9), suite.SplitCache())


@pytest.mark.parametrize("cache_rule", ["context", None])
def test_kv_cache_over_a_data_tensor_context_mesh_prefills_round_the_ring_and_steps_on_each_shard(cache_rule, ring_calls):
    """Decoding through the same `__call__` as training under a data x tensor x context mesh: with the rule
    'cache_length' -> 'context' the 16-token prefill goes round the ring and the step attends to each device's own
    cache slots (sharded_decode_attend); with 'cache_length' -> None the cache is attended gathered. The logits of one
    device either way."""
    model = _model("lssa")
    tokens = jax.random.randint(jax.random.key(2), (2, 17), 0, 64)

    @nnx.jit
    def prefill_and_step(model, tokens):
        logits, cache = model(tokens[:, :16], cache=model.init_cache(2, 32))
        return jnp.concatenate([logits, model(tokens[:, 16:], cache=cache)[0]], axis=1)

    expected = prefill_and_step(model, tokens)
    steps = []
    real = attention.sharded_decode_attend
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "sharded_decode_attend", lambda *a, **k: steps.append(a[1].shape[1]) or real(*a, **k))
        mesh, rules = sharding.make_mesh((2, 1, 2, 2)), (*RULES, ("cache_length", cache_rule))
        graphdef, state = nnx.split(model)
        with sharding.use_mesh(mesh, rules):
            logits = prefill_and_step(
                nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh, RULES))), tokens
            )
    sharded = cache_rule is not None
    assert [(c["axis_name"], c["q_len"]) for c in ring_calls] == [("context", 16)] * 2 * sharded  # both layers' prefills
    assert steps == [32] * 2 * sharded  # both layers' step, against the 32 slots
    np.testing.assert_allclose(logits, expected, atol=1e-5)


def test_passkey_from_freeatten_eval_over_context_8_equals_single_device_eval(
    text_glob, trained_run, tmp_path, run_cli, ring_calls
):
    """Passkey and training-format retrieval at 256 tokens (16x the training length; 32 cache slots a device): the prompt
    prefilled round the ring, each greedy step decoded on every device's slots (each step's attention checked against
    the cache attended whole: a tiny model's greedy tokens hardly depend on it), the candidates' log-likelihoods round
    the ring; the same cells as without the axis."""
    from freeatten_jax.cli import evaluate as eval_cli
    from freeatten_jax.evaluation import results

    run = str(trained_run("eval-resume-lssa", tiny_config("lssa", text_glob)))  # test_eval_resume's run
    flags = ["--multipliers=16", "--eval_tokens=257", "--passkey_depths=0.5", "--passkey_keys=1", "--passkey_candidates=3"]
    errors = []  # each decoding step's max error, relative to the largest output of the cache attended whole
    real = attention.sharded_decode_attend

    def checked(q, k, v, *, mesh, axis_name, batch_axis, head_axis, block_k, **options):
        out = real(
            q, k, v, mesh=mesh, axis_name=axis_name, batch_axis=batch_axis, head_axis=head_axis, block_k=block_k, **options
        )
        whole = attention.attend(q, k, v, implementation="reference", **options)
        jax.debug.callback(lambda e: errors.append(float(e)), jnp.max(jnp.abs(out - whole)) / jnp.max(jnp.abs(whole)))
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "sharded_decode_attend", checked)
        for context in (1, 8):
            code, lines = run_cli(
                eval_cli.main, f"--workdir={run}", f"--out={tmp_path / str(context)}", f"--context={context}", *flags
            )
            assert code == 0, lines
            assert bool(errors) == (context == 8)
    assert max(errors) < 1e-5
    prefills = {c["q_len"] for c in ring_calls if "kv_mask" in c}  # the cache's calls round the ring
    assert prefills and all(t % 16 == 0 and t <= 256 for t in prefills), prefills
    assert {c["q_len"] for c in ring_calls if "kv_mask" not in c} > {256}  # the loss, and the padded log-likelihoods
    (single,), _ = results.read(tmp_path / "1" / "results.json")
    (sharded,), _ = results.read(tmp_path / "8" / "results.json")
    scored = lambda r: [*r.passkey, *r.retrieval]  # noqa: E731
    assert [(c.length, c.keys, c.reason) for c in scored(sharded)] == [(256, 1, "")] * 2  # both scored at 256 tokens
    assert [(c.accuracy, c.mean_key_rank) for c in scored(sharded)] == [(c.accuracy, c.mean_key_rank) for c in scored(single)]
    np.testing.assert_allclose(
        [c.mean_key_loglik for c in scored(sharded)], [c.mean_key_loglik for c in scored(single)], rtol=1e-5
    )
