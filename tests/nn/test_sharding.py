"""Sharding by configuration: the mesh, logical rules, sharded == single-device for every variant,
parameters and optimizer state placed as intended, activation constraints, multi-process detection."""

import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from freeatten_jax import attention
from freeatten_jax.nn import Transformer, preset, sharding
from freeatten_jax.training import distributed

RULES = sharding.DEFAULT_RULES
SEGMENTS = jnp.array([[0] * 6 + [1] * 10] * 8)
POSITIONS = jnp.array([list(range(6)) + list(range(10))] * 8)


def _cfg(variant="softmax"):
    return preset(
        "tiny", num_layers=1, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=64, vocab_size=64, max_len=16, attention=variant
    )


def _mesh(shape):
    return sharding.make_mesh(shape)


def _loss(model, tokens, positions, segments):
    logits = model(tokens, positions_BT=positions, segment_ids_BT=segments)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], axis=-1)
    return nll.mean(), logits


VARIANTS = list(attention.VARIANTS)


@nnx.jit
def _all_values_and_grads(models, tokens, positions, segments):
    """Loss, logits and gradients of every variant's model, in one compilation."""
    return [nnx.value_and_grad(_loss, has_aux=True)(m, tokens, positions, segments) for m in models]


def _tokens():
    return jax.random.randint(jax.random.key(1), (8, 16), 0, 64)


def _single_device():
    models = [Transformer(_cfg(variant), rngs=nnx.Rngs(0)) for variant in VARIANTS]
    return models, jax.tree.map(np.asarray, _all_values_and_grads(models, _tokens(), POSITIONS, SEGMENTS))


def test_slices_make_data_the_outer_axis_across_slices_and_nothing_else_crosses():
    """mesh.slices=2 on 8 host devices (no slice_index: consecutive halves stand for the slices): each 'data' row
    holds one slice's devices, so fsdp, tensor and context never leave it; shapes that would split a slice are refused
    in one line (the TPU case, where the devices carry their slice, is compiled in test_compile)."""
    devices = jax.devices()[:8]
    mesh = sharding.make_mesh((2, 1, 2, 2), devices, slices=2)
    assert [list(row.flat) for row in mesh.devices] == [devices[:4], devices[4:]]
    assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "tensor": 2, "context": 2}
    with pytest.raises(ValueError, match=r"its 'data' size 1 must be a multiple of mesh.slices=2"):
        sharding.make_mesh((1, 1, 1, 8), devices, slices=2)


def test_mesh_shape_fills_minus_one_and_rejects_bad_shapes():
    assert sharding.mesh_shape((-1, 1, 1), 8) == (8, 1, 1, 1)
    assert sharding.mesh_shape((1, -1, 2), 8) == (1, 4, 2, 1)
    mesh = _mesh((2, -1, 2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2, "context": 1}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    for bad in [(3, -1, 1), (-1, -1, 1), (2, 2, 1), (8, 1), (1, 1, 1, 1, 8)]:
        with pytest.raises(ValueError, match="mesh.shape"):
            sharding.mesh_shape(bad, 8)


def test_context_axis_defaults_to_1_and_shards_the_sequence_for_attention():
    assert sharding.mesh_shape((2, -1, 1), 8) == (2, 4, 1, 1)
    assert sharding.mesh_shape((2, 1, 1, -1), 8) == (2, 1, 1, 4)
    mesh = _mesh((2, 1, 2, 2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "tensor": 2, "context": 2}
    assert sharding.logical_spec(("act_batch", "act_length", "act_embed"), (8, 16, 32), mesh, RULES) == P("data", "context", None)
    assert sharding.logical_spec(("batch", "length"), (8, 17), mesh, RULES) == P("data", None)  # inputs and targets
    assert sharding.context_parallelism((8, 16, 4), 2) is None  # outside use_mesh
    with sharding.use_mesh(mesh, RULES):
        expected = dict(mesh=mesh.abstract_mesh, axis_name="context", batch_axis="data", head_axis="tensor")
        assert sharding.context_parallelism((8, 16, 4), 2) == expected
        assert sharding.context_parallelism((8, 16, 4), 1)["head_axis"] is None  # one kv head: heads replicated
        assert sharding.context_parallelism((8, 15, 4), 2) is None  # a length the axis does not divide
    with sharding.use_mesh(_mesh((8, 1, 1)), RULES):
        assert sharding.context_parallelism((8, 16, 4), 2) is None  # context of size 1
    with sharding.use_mesh(mesh, (*RULES, ("act_length", ("tensor", "context")))):
        with pytest.raises(ValueError, match="context parallelism takes one mesh axis"):
            sharding.context_parallelism((8, 16, 4), 2)


def test_logical_spec_resolves_rules_and_replicates_what_does_not_divide():
    mesh = _mesh((1, 2, 4))
    assert sharding.logical_spec(("embed", "heads", "head_dim"), (32, 4, 8), mesh, RULES) == P("fsdp", "tensor", None)
    assert sharding.logical_spec(("embed", "kv_heads", "head_dim"), (32, 2, 8), mesh, RULES) == P("fsdp", None, None)
    assert sharding.logical_spec(("vocab", "embed"), (50257, 768), mesh, RULES) == P(None, "fsdp")
    assert sharding.logical_spec(("batch", "length"), (8, 16), _mesh((2, 2, 2)), RULES) == P(("data", "fsdp"), None)
    assert sharding.logical_spec(("batch", "length"), (2, 16), _mesh((2, 2, 2)), RULES) == P("data", None)
    with pytest.raises(ValueError, match="no sharding rule for logical axes \\['experts'\\]"):
        sharding.logical_spec(("experts",), (8,), mesh, RULES)


def test_sharded_forward_and_gradients_equal_single_device():
    """Every variant, its parameters placed by the rules on a data x fsdp x tensor mesh, the batch split over data x fsdp.
    (One mesh: the rules' other placements are test_logical_spec's; context parallelism is test_context_training's.)"""
    models, expected = _single_device()
    shape = (2, 2, 2)
    mesh = _mesh(shape)
    sharded = []
    for model in models:
        graphdef, state = nnx.split(model)
        sharded.append(nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh, RULES))))
    batch = sharding.batch_sharding(mesh, RULES, (8, 16))
    with sharding.use_mesh(mesh, RULES):
        inputs = [jax.device_put(x, batch) for x in (_tokens(), POSITIONS, SEGMENTS)]
        results = _all_values_and_grads(sharded, *inputs)
    for variant, ((loss, logits), grads), ((loss_1, logits_1), grads_1) in zip(VARIANTS, results, expected):
        assert {s.data.shape[0] for s in logits.addressable_shards} == {8 // (shape[0] * shape[1])}, variant
        np.testing.assert_allclose(loss, loss_1, rtol=1e-5, err_msg=variant)
        np.testing.assert_allclose(logits, logits_1, atol=1e-5, err_msg=variant)
        jax.tree.map(lambda a, b, v=variant: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4, err_msg=v), grads, grads_1)


def _canonical(spec):
    """A PartitionSpec without trailing Nones (P('fsdp', None) and P('fsdp') place data alike)."""
    axes = list(spec)
    while axes and axes[-1] is None:
        axes.pop()
    return P(*axes)


def _specs(state):
    return {"/".join(map(str, p)): _canonical(v[...].sharding.spec) for p, v in nnx.to_flat_state(state)}


EXPECTED_PARAM_SPECS = {  # mesh (1, 2, 4): fsdp 2, tensor 4; 2 kv heads cannot split 4 ways
    "embed_VE": P("tensor", "fsdp"),
    "blocks/0/attn/wq_EHD": P("fsdp", "tensor", None),
    "blocks/0/attn/wk_EKD": P("fsdp", None, None),
    "blocks/0/attn/wo_HDE": P("tensor", None, "fsdp"),
    "blocks/0/mlp/w_in_EF": P("fsdp", "tensor"),
    "blocks/0/mlp/w_out_FE": P("tensor", "fsdp"),
    "blocks/0/attn_norm/scale_E": P("fsdp"),
}


def test_parameters_and_optimizer_state_carry_intended_shardings():
    mesh = _mesh((1, 2, 4))
    model = sharding.build_sharded(lambda: Transformer(_cfg("ssmax"), rngs=nnx.Rngs(0)), mesh, RULES)
    params = _specs(nnx.state(model, nnx.Param))
    assert {k: params[k] for k in EXPECTED_PARAM_SPECS} == {k: _canonical(v) for k, v in EXPECTED_PARAM_SPECS.items()}
    assert params["blocks/0/attn/s_H"] == P("tensor")
    wq = model.blocks[0].attn.wq_EHD[...]
    assert {s.data.shape for s in wq.addressable_shards} == {(16, 1, 8)}  # 32/2 embed, 4/4 heads

    single = Transformer(_cfg("ssmax"), rngs=nnx.Rngs(0))  # build_sharded initialises the same values
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), nnx.state(model, nnx.Param), nnx.state(single, nnx.Param)
    )

    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    shardings = sharding.state_shardings(nnx.state(optimizer), mesh, RULES)
    target = {"/".join(map(str, p)): _canonical(s.get_value().spec) for p, s in nnx.to_flat_state(shardings)}
    for moment in ("mu", "nu"):
        assert {name: target[f"opt_state/0/{moment}/{name}"] for name in params} == params

    @nnx.jit
    def train_step(model, optimizer, tokens):
        grads = nnx.grad(lambda m: _loss(m, tokens, None, None)[0])(model)
        optimizer.update(model, grads)

    with sharding.use_mesh(mesh, RULES):
        train_step(model, optimizer, jax.device_put(_tokens(), sharding.batch_sharding(mesh, RULES, (8, 16))))
    assert _specs(nnx.state(model, nnx.Param)) == params  # an update keeps the placement
    moments = _specs(nnx.state(optimizer))
    for moment in ("mu", "nu"):
        assert {name: moments[f"opt_state/0/{moment}/{name}"] for name in params} == params


def test_abstract_state_is_a_sharded_restore_target():
    mesh = _mesh((2, 2, 2))
    build = lambda: Transformer(_cfg("lssa"), rngs=nnx.Rngs(0))
    abstract, shardings = sharding.abstract(lambda: nnx.state(build()), mesh, RULES)
    graphdef = nnx.graphdef(nnx.eval_shape(build))
    model = sharding.build_sharded(build, mesh, RULES)
    real = nnx.state(model)
    assert jax.tree.structure(abstract) == jax.tree.structure(real)
    for a, r in zip(jax.tree.leaves(abstract), jax.tree.leaves(real)):
        assert isinstance(a, jax.ShapeDtypeStruct) and a.shape == r.shape and a.dtype == r.dtype
        assert a.sharding == r.sharding
    assert jax.tree.leaves(shardings) == [a.sharding for a in jax.tree.leaves(abstract)]
    restored = nnx.merge(graphdef, real)
    assert isinstance(restored, Transformer)


def test_activations_are_constrained_only_under_use_mesh():
    mesh = _mesh((2, 2, 2))
    names = ("act_batch", "act_length", "act_embed")
    x = jnp.ones((8, 4, 6))
    assert sharding.constrain(x, names) is x
    model = Transformer(_cfg(), rngs=nnx.Rngs(0))
    lowered = lambda: nnx.jit(lambda m, t: m(t)).lower(model, _tokens()).as_text()
    on_mesh = lambda text: re.findall(r"sharding_constraint %\S+ <@mesh, (\[.*?\])>", text)
    assert on_mesh(lowered()) == []
    with sharding.use_mesh(mesh, RULES):
        constraints = on_mesh(lowered())
    act = '[{"data", "fsdp"}, {}, {}]'
    assert constraints == [act, act, '[{"data", "fsdp"}, {}, {"tensor"}]']  # embeddings, the block, logits


@pytest.mark.parametrize(
    "environ, multi",
    [
        ({}, False),
        ({"SLURM_NTASKS": "1"}, False),
        ({"SLURM_NTASKS": "4"}, True),
        ({"TPU_WORKER_HOSTNAMES": "h0,h1"}, True),
        ({"TPU_WORKER_HOSTNAMES": "h0"}, False),
        ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, True),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, True),
    ],
)
def test_multi_process_detection(environ, multi, monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append(1))
    assert distributed.is_multi_process(environ) is multi
    assert distributed.multi_process_sign(environ) == ("=".join(*environ.items()) if multi else None)
    assert distributed.initialize_distributed(environ) is multi
    assert len(calls) == int(multi)


@pytest.mark.parametrize(
    "shape, expected",
    [
        ((2, 1, 1, 4), (0, 2)),  # the data axis across processes 0, 1 | 2, 3
        ((4, 1, 1, 2), (1, 4)),  # each process its own rows
        ((2, 2, 1, 2), (1, 4)),  # over data x fsdp
        ((1, 2, 2, 2), (0, 2)),
        ((1, 1, 1, 8), (0, 1)),  # the context axis across all four: one block
        ((1, 1, 2, 4), (0, 1)),
    ],
)
def test_processes_holding_the_same_batch_rows_read_the_same_windows(shape, expected):
    """data_shard on 8 devices of 4 processes (2 each, in order), seen from process 1: its block of batch rows among
    the distinct blocks; a 'context' or 'tensor' axis across processes makes them share one."""
    devices = np.array([types.SimpleNamespace(process_index=i // 2) for i in range(8)]).reshape(shape)
    mesh = types.SimpleNamespace(axis_names=sharding.MESH_AXES, devices=devices)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax, "process_index", lambda: 1)
        assert distributed.data_shard(mesh, RULES) == expected


def test_host_local_batch_becomes_the_global_sharded_batch():
    mesh = _mesh((2, 2, 2))
    local = np.arange(8 * 16, dtype=np.int32).reshape(8, 16)
    batch = distributed.host_local_batch_to_global(local, mesh, RULES)  # one process: its rows are the batch
    np.testing.assert_array_equal(batch, local)
    assert batch.sharding.is_equivalent_to(sharding.batch_sharding(mesh, RULES, (8, 16)), 2)
    assert {s.data.shape for s in batch.addressable_shards} == {(2, 16)}
