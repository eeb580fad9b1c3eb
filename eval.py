"""Long-context extrapolation suite: loss vs length, passkey retrieval and attention analysis.

  python eval.py --workdir=runs/softmax --workdir=runs/lssa --switch=p=15 --out=reports/x

Each checkpoint is evaluated as trained and under every applicable `--switch` (LSSAR re-weighting
`p=15` / `p=off` on lssa/lssar runs, `rope_theta=50x` or an absolute base, SSMax `s=0.3`).
"""
import sys

from absl import app, flags, logging

from freeatten_jax.evaluation import suite

_WORKDIRS = flags.DEFINE_multi_string("workdir", None, "Training run directory (repeat for several).", required=True)
_OUT = flags.DEFINE_string("out", None, "Directory for report.md, results.json, CSV files and plots.", required=True)
_SWITCHES = flags.DEFINE_multi_string("switch", [], "Eval-time switch, e.g. p=15, p=off, rope_theta=50x, s=0.3.")
_MULTIPLIERS = flags.DEFINE_list("multipliers", ["1", "2", "4", "8", "16"], "Evaluation lengths in training lengths.")
_MAX_WINDOWS = flags.DEFINE_integer("max_windows", 16, "Held-out windows per length.")
_DEPTHS = flags.DEFINE_list("passkey_depths", ["0.1", "0.5", "0.9"], "Needle depths (0 = start, 1 = end).")
_KEYS = flags.DEFINE_integer("passkey_keys", 3, "Random keys per passkey cell.")
_CANDIDATES = flags.DEFINE_integer("passkey_candidates", 10, "Keys ranked by likelihood, the true one included.")
_ANALYSIS = flags.DEFINE_integer("analysis_windows", 1, "Windows of the longest length for the entropy analysis.")
_IMPLEMENTATION = flags.DEFINE_string("implementation", "auto", "Attention implementation at every length.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the passkey keys.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:  # orbax's read-only notices drown the progress bar
        logging.set_verbosity(logging.ERROR)
    settings = suite.Settings(
        multipliers=tuple(sorted(int(m) for m in _MULTIPLIERS.value)),
        max_windows=_MAX_WINDOWS.value,
        passkey_depths=tuple(float(d) for d in _DEPTHS.value),
        passkey_keys=_KEYS.value,
        passkey_candidates=_CANDIDATES.value,
        analysis_windows=_ANALYSIS.value,
        implementation=_IMPLEMENTATION.value,
        seed=_SEED.value,
    )
    try:
        suite.run_suite(_WORKDIRS.value, _SWITCHES.value, settings, _OUT.value)
    except (FileNotFoundError, ValueError) as e:  # no checkpoint, unknown switch, a length the data cannot fill
        sys.exit(f"error: {e}")
    print(f"report: {_OUT.value}/report.md")


if __name__ == "__main__":
    app.run(main)
