"""Optax optimiser: AdamW (b1 0.9, b2 0.95) with weight decay on matrices only, global-norm clipping,
warm-up then a cosine or constant schedule. (Gradient accumulation happens in the train step.)

The schedule and the optimiser are built once per (optim config, steps): the train step takes them as static
arguments, so equal objects let a second run of the same config in one process reuse its traced, compiled step."""

import functools

import jax
import optax


def _cosine(cfg, steps: int):
    return optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr, cfg.warmup_steps, max(steps, cfg.warmup_steps + 1), cfg.lr * cfg.min_lr_ratio
    )


def _constant(cfg, steps: int):
    return optax.join_schedules(
        [optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), optax.constant_schedule(cfg.lr)], [cfg.warmup_steps]
    )


SCHEDULES = {"cosine": _cosine, "constant": _constant}


@functools.cache
def schedule(cfg_optim, steps: int) -> optax.Schedule:
    """Learning rate per optimiser step (warm-up from 0, then `cfg_optim.schedule`)."""
    return SCHEDULES[cfg_optim.schedule](cfg_optim, steps)


def warnings(cfg_optim, steps: int) -> list[str]:
    """A schedule whose warm-up outlasts the run never reaches optim.lr: said once, before training."""
    if cfg_optim.warmup_steps < steps:
        return []
    peak = float(schedule(cfg_optim, steps)(steps - 1))
    return [
        f"optim.warmup_steps={cfg_optim.warmup_steps} >= train.steps={steps}: the learning rate peaks at {peak:.3g} "
        f"at the last step and never reaches optim.lr={cfg_optim.lr:g}"
    ]


def _matrices(params):
    return jax.tree.map(lambda p: p.ndim > 1, params)


@functools.cache
def make(cfg_optim, steps: int) -> optax.GradientTransformation:
    """Clip, then AdamW on the scheduled learning rate."""
    return optax.chain(
        optax.clip_by_global_norm(cfg_optim.clip_norm),
        optax.adamw(
            schedule(cfg_optim, steps),
            b1=cfg_optim.b1,
            b2=cfg_optim.b2,
            eps=cfg_optim.eps,
            weight_decay=cfg_optim.weight_decay,
            mask=_matrices,
        ),
    )
