"""`freeatten-eval`: the long-context extrapolation suite (loss vs length, passkey retrieval, attention analysis).

    freeatten-eval --workdir=runs/softmax --workdir=runs/lssa --switch=p=15 --out=reports/x

Each checkpoint is evaluated as trained and under every applicable `--switch` (LSSAR re-weighting
`p=15` / `p=off` on lssa/lssar runs, `rope_theta=50x` or an absolute base, SSMax `s=0.3`, RoPE scaling
`rope_linear=4` or `rope_llama3=8`).

Every finished measurement (cell) is saved in OUT/cells at once: rerunning the same command after a kill or a stop
skips the cells done and writes the same results. Exit codes: 0 done, 1 error, 75 stopped by SIGTERM/SIGINT after the
cell in progress (rerun the same command to resume).
"""

import math
import pathlib
import sys

from absl import flags, logging

from freeatten_jax.cli import fields
from freeatten_jax.cli import shared as cli
from freeatten_jax.errors import EXIT_PREEMPTED, UserError
from freeatten_jax.evaluation.settings import Settings

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
    settings = fields.define(Settings, __name__)  # one flag per evaluation setting
    quick = flags.DEFINE_bool(
        "quick",
        False,
        "A first look in minutes on a CPU: lengths 1x, 4x, 16x, a quarter of the span, "
        "one passkey depth and key, 64 MQAR instances (overrides those flags).",
    )

    def evaluate(_):
        from freeatten_jax.evaluation import suite
        from freeatten_jax.training import distributed

        if sign := distributed.multi_process_sign():
            raise UserError(
                f"freeatten-eval runs in one process, its --context over that host's devices, but {sign} says this job has "
                "several: run it once, on one host, outside the multi-process launcher"
            )
        for text in switches.value:
            _check_switch(text)
        chosen = fields.value(Settings, settings)
        chosen = chosen.quick() if quick.value else chosen
        try:
            suite.run_suite(workdirs.value, switches.value, chosen, out.value, tuple(merge.value))
        except suite.Stopped as e:
            print(e, file=sys.stderr)
            sys.exit(EXIT_PREEMPTED)
        for name in ("report.md", "mqar.md"):
            if (pathlib.Path(out.value) / name).exists():
                print(f"report: {out.value}/{name}")

    cli.run(evaluate, sys.argv, verbosity=logging.ERROR)  # orbax's read-only notices drown the progress bar
