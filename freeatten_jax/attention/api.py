"""`attend` and `attention_weights`: a variant (what is computed) through an implementation (how).

Glossary: B batch, T queries, S keys, H query heads, K key/value heads, D head dim.
"""

import inspect

import jax

from freeatten_jax.attention import arguments, auto, blockwise, pallas, reference
from freeatten_jax.attention.variants import get_variant

IMPLEMENTATIONS = {
    "reference": reference.attend,
    "blockwise": blockwise.attend,
    "pallas": pallas.attend,
    "auto": auto.attend,
}


def attend(q, k, v, *, variant: str, causal: bool = True, implementation: str = "auto", **options) -> jax.Array:
    """Attention output [B, T, H, D] in q's dtype (normalisation in float32).

    options: the variant's own (`s`, `b` for ssmax; `p` for lssar, None = off; `scale` instead of
    1/sqrt(d) for softmax, ssmax, sigmoid and relu), the mask's (`q_positions`, `kv_positions`,
    `q_offset`, `q_segment_ids`, `kv_segment_ids`, `kv_mask`, `window`, `mask`: an explicit boolean
    [B or 1, H or 1, T, S] mask ANDed with the others), and any the implementation takes.
    Keys and values that no query of their batch row sees may hold NaN/Inf (docs/method.md §8); a row that
    sees no key outputs zeros. check_finite=True: concrete q, k, v are checked to lie where the output is
    guaranteed finite (§8), else one ValueError names the input at fault; traced ones are refused.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {implementation!r}; valid: {', '.join(IMPLEMENTATIONS)}")
    spec, mask, opts, impl_options = arguments.parse(q, k, v, variant, causal, dict(options))
    _check_unknown(variant, implementation, impl_options)
    return IMPLEMENTATIONS[implementation](q, k, v, variant=spec, mask=mask, opts=opts, **impl_options)


def attention_weights(q, k, v, *, variant: str, causal: bool = True, **options) -> jax.Array:
    """The full weight matrix A as [B, H, T, S] float32 (reference path; for analysis and tests)."""
    spec, mask, opts, rest = arguments.parse(q, k, v, variant, causal, dict(options))
    rest.pop("implementation", None)
    _check_unknown(variant, "reference", rest)
    return reference.weights(q, k, variant=spec, mask=mask, opts=opts)


def implementation_options(name: str) -> tuple[str, ...]:
    """The options implementation `name` takes beyond the variant's and the mask's (e.g. block sizes)."""
    params = inspect.signature(IMPLEMENTATIONS[name]).parameters.values()
    return tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in ("variant", "mask", "opts"))


def _check_unknown(variant: str, implementation: str, rest: dict) -> None:
    """A ValueError naming every option this call could take (the variant's, the implementation's and the mask's)
    when `rest`, the options neither the variant nor the mask took, holds one the implementation does not take."""
    accepted = implementation_options(implementation)
    if unknown := set(rest) - set(accepted):
        raise ValueError(
            f"unknown option(s) {sorted(unknown)}: variant {variant!r} takes "
            f"{', '.join(get_variant(variant).defaults) or 'none'}; implementation {implementation!r} takes "
            f"{', '.join(accepted) or 'none'}; every variant takes the mask options "
            f"{', '.join(arguments.MASK_OPTIONS)}, and check_finite"
        )
