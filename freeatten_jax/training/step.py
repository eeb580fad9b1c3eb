"""The steps every caller runs: `make_train_step` and `make_eval_step` (jitted, a config's static arguments bound), and
the pure functions under them, `train_step(state, tokens_BL) -> (state, metrics)` and the validation loss sums.

Glossary: B batch, L = T + 1 window (inputs tokens[:, :-1], targets tokens[:, 1:]), T length,
A gradient-accumulation micro-batches. The graphdef is always the static keyword `graphdef`; `eos_id`
(static, None: off) turns on document masking (freeatten_jax.data.documents); `targets` (static, None: all)
are the target positions the loss counts (data.loss_targets: MQAR's answers).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from freeatten_jax import data
from freeatten_jax.training import optim
from freeatten_jax.training import state as train_state
from freeatten_jax.training.loss import next_token_losses


def scored(losses_BT, targets):
    """The losses the objective counts: those at the `targets` positions [B, len(targets)], or all [B, T]."""
    return losses_BT if targets is None else losses_BT[:, list(targets)]


def _grad_step(graphdef, params, rest, tokens_BL, eos_id, targets):
    """(mean loss, gradients, the model's updated non-parameter state) for one micro-batch.

    The model is merged here and differentiated with nnx.value_and_grad: its lifted remat cannot run
    under a bare jax.grad.
    """
    model = nnx.merge(graphdef, params, rest, copy=True)  # fresh variables at this trace level (inside scan)
    loss_fn = lambda m: scored(next_token_losses(m, tokens_BL, eos_id=eos_id), targets).mean()
    loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param))(model)
    return loss, grads, nnx.state(model, nnx.Not(nnx.Param))


def train_step(
    state,
    tokens_BL,
    *,
    graphdef,
    tx,
    schedule,
    accum_steps: int,
    eos_id: int | None = None,
    targets: tuple[int, ...] | None = None,
):
    """One optimiser step on the mean loss of A micro-batches of B / A windows each."""
    params = state["params"]
    tokens_ABL = tokens_BL.reshape(-1, accum_steps, tokens_BL.shape[-1]).swapaxes(0, 1)  # strided: each spans all devices

    def micro_step(carry, tokens_bL):
        grads_sum, loss_sum, rest = carry
        loss, grads, rest = _grad_step(graphdef, params, rest, tokens_bL, eos_id, targets)
        return (jax.tree.map(jnp.add, grads_sum, grads), loss_sum + loss, rest), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, loss, rest), _ = jax.lax.scan(micro_step, (zeros, jnp.zeros((), jnp.float32), state["rest"]), tokens_ABL)
    grads = jax.tree.map(lambda g: g / accum_steps, grads)
    loss = loss / accum_steps
    updates, opt_state = tx.update(grads, state["opt_state"], params)
    new_state = {"params": optax.apply_updates(params, updates), "rest": rest, "opt_state": opt_state, "step": state["step"] + 1}
    grad_norm = optax.global_norm(grads)
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": schedule(state["step"]),
        "finite": jnp.isfinite(loss) & jnp.isfinite(grad_norm),
    }
    return new_state, metrics


def eval_step(state, tokens_BL, weights_B, *, graphdef, eos_id: int | None = None, targets: tuple[int, ...] | None = None):
    """(sum of weighted token losses, number of weighted tokens) for a batch of validation windows."""
    losses_BT = scored(next_token_losses(nnx.merge(graphdef, state["params"], state["rest"]), tokens_BL, eos_id=eos_id), targets)
    return jnp.sum(losses_BT * weights_B[:, None]), jnp.sum(weights_B) * losses_BT.shape[1]


class Step(NamedTuple):
    """A jitted step with a config's static arguments bound: call it on arrays, or `lower` it on abstract ones."""

    jitted: Callable
    static: dict

    def __call__(self, *args):
        return self.jitted(*args, **self.static)

    def lower(self, *args) -> jax.stages.Lowered:
        return self.jitted.lower(*args, **self.static)


# XLA's GPU scheduler keeps one collective in flight by default: round the context-parallel ring the K, V and key
# factor blocks (and, backward, the dK/dV sums) then wait for one another, and only one of them overlaps the step's
# kernel. With room for 8 every rotation of a ring step runs during its kernels (tests/compile/test_run.py). The other
# backends accept the option and ignore it.
COMPILER_OPTIONS = {"xla_gpu_experimental_parallel_collective_overlap_limit": 8}


def make_train_step(cfg, state_shardings) -> Step:
    """The config's train step `(state, tokens_BL) -> (state, metrics)`: the state arrives placed in `state_shardings`
    and is donated; the new state keeps them (training and freeatten-compile run this one). Build it outside a mesh
    context (the model's graphdef is traced without one); call or lower it inside (sharding.use_mesh)."""
    jitted = jax.jit(
        train_step,
        static_argnames=("graphdef", "tx", "schedule", "accum_steps", "eos_id", "targets"),
        out_shardings=(state_shardings, None),
        donate_argnums=0,
        compiler_options=COMPILER_OPTIONS,
    )
    static = dict(
        graphdef=train_state.graphdefs(cfg.model)[0],
        tx=optim.make(cfg.optim, cfg.train.steps),
        schedule=optim.schedule(cfg.optim, cfg.train.steps),
        accum_steps=cfg.train.grad_accum_steps,
        eos_id=data.document_eos(cfg.data),
        targets=data.loss_targets(cfg.data, cfg.train.seq_len),
    )
    return Step(jitted, static)


def make_eval_step(cfg) -> Step:
    """The config's validation step `(state, tokens_BL, weights_B) -> (loss sum, token count)` (inputs arrive placed)."""
    jitted = jax.jit(eval_step, static_argnames=("graphdef", "eos_id", "targets"), compiler_options=COMPILER_OPTIONS)
    static = dict(
        graphdef=train_state.graphdefs(cfg.model)[1],
        eos_id=data.document_eos(cfg.data),
        targets=data.loss_targets(cfg.data, cfg.train.seq_len),
    )
    return Step(jitted, static)
