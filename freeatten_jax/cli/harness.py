"""`freeatten-harness`: lm-evaluation-harness tasks on checkpoints x eval-time switches x context multipliers.

    freeatten-harness --workdir=runs/lssar --switch=p=15 --multipliers=1,4 --out=reports/harness
        --tasks=lambada_openai,hellaswag,piqa,arc_easy,arc_challenge,winogrande

The harness's datasets download from the Hugging Face Hub (network needed once; cached after); --include_path adds
task YAMLs of your own (e.g. `dataset_path: json` on local files). Writes OUT/harness.json and OUT/harness.md.
"""

import sys

from absl import flags, logging

from freeatten_jax.attention import IMPLEMENTATIONS
from freeatten_jax.cli import shared as cli


def main() -> None:
    workdirs = flags.DEFINE_multi_string(
        "workdir", None, "Training run directory, or WORKDIR@STEP for one of its checkpoints (repeat for several).", required=True
    )
    tasks = flags.DEFINE_list("tasks", None, "lm-eval task names, comma-separated.", required=True)
    out = flags.DEFINE_string("out", None, "Directory for harness.json and harness.md.", required=True)
    switches = flags.DEFINE_multi_string("switch", [], "Eval-time switch, e.g. p=15, p=off, rope_theta=50x, s=0.3.")
    multipliers = flags.DEFINE_list("multipliers", ["1"], "Context lengths, as multiples of the training length.")
    include_path = flags.DEFINE_string("include_path", None, "A folder of extra task YAMLs.")
    default_tasks = flags.DEFINE_bool("default_tasks", True, "Index the harness's own tasks (off: --include_path's only).")
    limit = flags.DEFINE_integer("limit", None, "Documents per task at most (a quick look).", lower_bound=1)
    implementation = flags.DEFINE_enum("implementation", "auto", list(IMPLEMENTATIONS), "Attention implementation.")
    batch_tokens = flags.DEFINE_integer("batch_tokens", 4096, "Tokens per forward pass (padding included).", lower_bound=1)

    def run(_):
        from freeatten_jax.errors import UserError
        from freeatten_jax.evaluation import harness_report

        if not all(m.isdigit() and int(m) >= 1 for m in multipliers.value):
            raise UserError(f"--multipliers={','.join(multipliers.value)} is invalid; allowed: integers >= 1")
        rows = harness_report.evaluate(
            workdirs.value,
            switches.value,
            [int(m) for m in multipliers.value],
            tasks.value,
            include_path=include_path.value,
            default_tasks=default_tasks.value,
            limit=limit.value,
            implementation=implementation.value,
            batch_tokens=batch_tokens.value,
        )
        harness_report.write(out.value, rows)
        print(f"report: {out.value}/harness.md")

    cli.run(run, sys.argv, verbosity=logging.ERROR)
