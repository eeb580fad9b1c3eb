"""sharded_decode_attend (a KV cache split over a mesh axis, each device's partial row statistics merged across
it) equals the single-device `attend` on 8 forced host devices.

Glossary: B batch, T new queries, S cache slots, H heads, K kv heads, D head dim. Tolerance: tests/helpers.py's
float32 one (summation order only).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TOLERANCE, assert_close, inputs, key, variant_params

from freeatten_jax import attention

SLOTS = 64  # 8 slots a device on the 8-device axis


def _mesh(**axes):
    devices = jax.devices()[: int(np.prod(list(axes.values())))]
    return jax.make_mesh(tuple(axes.values()), tuple(axes), devices=devices, axis_types=(jax.sharding.AxisType.Auto,) * len(axes))


def _cache(b, t, h, kv_heads, filled):
    """GQA inputs (q scaled up, so LSSAR's rows are sharp) and the mask options of a cache filled to `filled` slots per
    row, the T queries its last T entries."""
    q_BTHD, k_BSKD, v_BSKD, _ = inputs(key("sharded decode", str(filled)), b, t, SLOTS, h, kv_heads, 8)
    filled_B = jnp.array(filled)
    options = dict(q_offset=filled_B - t, kv_mask=jnp.arange(SLOTS)[None] < filled_B[:, None])
    return 3 * q_BTHD, k_BSKD, v_BSKD, options


def _decode(mesh, axes, variant, q, k, v, options):
    run = lambda q, k, v, options: attention.sharded_decode_attend(q, k, v, mesh=mesh, variant=variant, **axes, **options)  # noqa: E731
    return jax.jit(run)(q, k, v, options)


@pytest.mark.parametrize("variant", list(attention.VARIANTS))
def test_one_step_over_context_8_equals_single_device_decoding(variant):
    """Row 0's cache is filled to 20 slots (devices 3 to 7 hold only padding); row 1's query is the first slot of
    device 5 (q_offset at a shard edge: that device sees one key)."""
    q, k, v, options = _cache(2, 1, 4, 2, [20, 41])
    options |= variant_params(variant, 4)
    want = attention.attend(q, k, v, variant=variant, implementation="reference", **options)
    got = _decode(_mesh(context=8), dict(axis_name="context"), variant, q, k, v, options)
    assert_close(got, want, TOLERANCE[jnp.float32], variant)


def test_lssar_over_data_2_context_4_with_two_new_tokens_re_weights_as_one_device():
    """Batch over 'data', two queries a row; LSSAR's re-weighting changes the output here (its rows are sharp), so
    a partial Z_i would show."""
    q, k, v, options = _cache(2, 2, 4, 2, [30, 64])
    want = attention.attend(q, k, v, variant="lssar", implementation="reference", **options)
    got = _decode(_mesh(data=2, context=4), dict(axis_name="context", batch_axis="data"), "lssar", q, k, v, options)
    assert_close(got, want, TOLERANCE[jnp.float32], "lssar")
    lssa = attention.attend(q, k, v, variant="lssa", implementation="reference", **options)
    assert float(jnp.max(jnp.abs(want - lssa))) > 0.1 * float(jnp.max(jnp.abs(want)))


def test_sharded_decode_refuses_a_cache_the_axis_does_not_split():
    q, k, v, _ = inputs(key("refuse"), 1, 1, 60, 2, 2, 8)
    with pytest.raises(ValueError, match=r"kv_len 60 must be a multiple of the 'context' axis size \(8\)"):
        attention.sharded_decode_attend(q, k, v, mesh=_mesh(context=8), axis_name="context", variant="lssar")
