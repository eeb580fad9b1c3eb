"""`freeatten-eval`: the long-context extrapolation suite (loss vs length, passkey retrieval, attention analysis).

    freeatten-eval --workdir=runs/softmax --workdir=runs/lssa --switch=p=15 --out=reports/x

Each checkpoint is evaluated as trained and under every applicable `--switch` (LSSAR re-weighting
`p=15` / `p=off` on lssa/lssar runs, `rope_theta=50x` or an absolute base, SSMax `s=0.3`, RoPE scaling
`rope_linear=4` or `rope_llama3=8`).
"""

import math
import pathlib
import sys

from absl import flags, logging

from freeatten_jax.attention import IMPLEMENTATIONS
from freeatten_jax.cli import shared as cli
from freeatten_jax.errors import UserError

_FACTOR = (lambda v: math.isfinite(float(v)) and float(v) > 0, "a finite number > 0")
# Values each switch takes (besides switches.parse's syntax); a bad one is refused before any checkpoint is read.
_SWITCH_VALUES = {
    "p": (lambda v: v == "off" or math.isfinite(float(v)) and float(v) > 0, "a number > 0 or off"),
    "rope_theta": (
        lambda v: math.isfinite(float(v.removesuffix("x"))) and float(v.removesuffix("x")) > 0,
        "a number > 0, absolute (500000) or relative (50x)",
    ),
    "s": (lambda v: math.isfinite(float(v)), "a finite number"),
    "rope_linear": _FACTOR,
    "rope_llama3": _FACTOR,
}


def _check_switch(text: str) -> None:
    from freeatten_jax.evaluation import switches

    try:
        switch = switches.parse(text)
    except UserError as e:
        raise UserError(f"--switch={text} is invalid: {e}") from None
    for key, value in switch.settings:
        ok, allowed = _SWITCH_VALUES[key]
        if not ok(value):
            raise UserError(f"--switch={text} is invalid: {key}={value}; allowed: {allowed}")


def main() -> None:
    workdirs = flags.DEFINE_multi_string(
        "workdir", None, "Training run directory, or WORKDIR@STEP for one of its checkpoints (repeat for several).", required=True
    )
    out = flags.DEFINE_string("out", None, "Directory for report.md, results.json, CSV files and plots.", required=True)
    switches = flags.DEFINE_multi_string(
        "switch", [], "Eval-time switch, e.g. p=15, p=off, rope_theta=50x, s=0.3, rope_linear=4."
    )
    merge = flags.DEFINE_multi_string(
        "merge",
        [],
        "An earlier evaluation's results.json (or .json.gz) whose runs join the report unmeasured; it must have been "
        "measured with the same lengths, span, passkey and MQAR settings (repeat for several).",
    )
    multipliers = flags.DEFINE(
        cli.NumberList(int, lambda m: m >= 1, "integers >= 1 (lengths in training lengths), e.g. 1,2,4"),
        "multipliers",
        "1,2,4,8,16",
        "Evaluation lengths in training lengths.",
    )
    eval_tokens = flags.DEFINE_integer(
        "eval_tokens",
        0,
        "Held-out tokens scored at every length (cut into windows of each length); 0: 16 windows of the longest length.",
    )
    depths = flags.DEFINE(
        cli.NumberList(float, lambda d: 0 <= d <= 1, "numbers in [0, 1], e.g. 0.1,0.5"),
        "passkey_depths",
        "0.1,0.5,0.9",
        "Needle depths (0 = start, 1 = end).",
    )
    keys = flags.DEFINE_integer("passkey_keys", 3, "Random keys per passkey cell.")
    candidates = flags.DEFINE_integer("passkey_candidates", 10, "Keys ranked by likelihood, the true one included.")
    analysis = flags.DEFINE_integer("analysis_windows", 1, "Windows of the longest length for the entropy analysis.")
    implementation = flags.DEFINE_enum("implementation", "auto", IMPLEMENTATIONS, "Attention implementation at every length.")
    seed = flags.DEFINE_integer("seed", 0, "Seed of the passkey keys.")
    quick = flags.DEFINE_bool(
        "quick",
        False,
        "A first look in minutes on a CPU: lengths 1x, 4x, 16x, a quarter of the span, "
        "one passkey depth and key, 64 MQAR instances (overrides those flags).",
    )
    mqar_instances = flags.DEFINE_integer(
        "mqar_instances", 256, "MQAR runs: instances per length (each queries every pair; the same instances at every length)."
    )
    placements = flags.DEFINE_list(
        "mqar_placements",
        "start,end",
        "MQAR runs: where the training window's pairs sit at longer lengths: start (as in training, noise before the "
        "queries) and/or end (noise first: the queries reach back as far as in training).",
    )
    context = flags.DEFINE_integer(
        "context",
        1,
        "Devices sharing each window's sequence (context parallelism; "
        "lengths must be multiples of 2x it) for the loss vs length.",
    )

    def evaluate(_):
        from freeatten_jax.data.mqar import PLACEMENTS
        from freeatten_jax.evaluation import suite

        for text in switches.value:
            _check_switch(text)
        if not placements.value or any(p not in PLACEMENTS for p in placements.value):
            raise UserError(
                f"--mqar_placements={','.join(placements.value)} is invalid; allowed: {', '.join(PLACEMENTS)} or both"
            )

        settings = suite.Settings(
            multipliers=tuple(sorted(multipliers.value)),
            eval_tokens=eval_tokens.value,
            passkey_depths=tuple(depths.value),
            passkey_keys=keys.value,
            passkey_candidates=candidates.value,
            analysis_windows=analysis.value,
            implementation=implementation.value,
            seed=seed.value,
            context=context.value,
            mqar_instances=mqar_instances.value,
            mqar_placements=tuple(placements.value),
        )
        suite.run_suite(
            workdirs.value, switches.value, settings.quick() if quick.value else settings, out.value, tuple(merge.value)
        )
        for name in ("report.md", "mqar.md"):
            if (pathlib.Path(out.value) / name).exists():
                print(f"report: {out.value}/{name}")

    cli.run(evaluate, sys.argv, verbosity=logging.ERROR)  # orbax's read-only notices drown the progress bar
