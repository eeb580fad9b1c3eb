"""`freeatten-import`: a Hugging Face Llama-family folder (config.json, model.safetensors or its shards with their index,
tokenizer.json) as a run of this project, read without torch: checkpoint 0 in WORKDIR. freeatten-eval,
freeatten-generate and load_run then work on it (with any --switch), and freeatten-train continues from it with any
attention (--config=lm:variant=lssar,init=WORKDIR).

    freeatten-import ~/SmolLM2-135M --workdir=runs/smollm2-135m [--config.train.seq_len=2048 --config.data.path=...]

The run's config is `lm:init=HF_DIR`: softmax attention, the model's sizes and tokenizer, train.seq_len its
max_position_embeddings (the length evaluations take as 1x); --config.* overrides any field, e.g. the text
freeatten-eval scores it on (--config.data.source=text --config.data.path=...). Exit 75: stopped by SIGTERM/SIGINT before
checkpoint 0 was written (rerun to import).
"""

import sys

from absl import flags
from ml_collections import config_flags

from freeatten_jax.cli import shared as cli
from freeatten_jax.errors import EXIT_PREEMPTED, UserError


def _check_folder(folder: str) -> None:
    """Exits with the folder's one `error:` line if it cannot be imported, before the config reads it as its
    config.init.path (whose errors would name that field, one the user of this command never set)."""
    from freeatten_jax.formats import hf_llama

    try:
        hf_llama.open_checkpoint(folder)
        hf_llama.tokenizer(folder)
    except hf_llama.HubError as e:
        sys.exit(f"error: {e}")


def main() -> None:
    from freeatten_jax.training import storage

    folders = [a for a in sys.argv[1:] if not a.startswith("-")]
    if len(folders) == 1 and not storage.path(folders[0]).exists():  # before --config reads it as a run's folder
        sys.exit(f"error: {folders[0]} does not exist: give a Hugging Face model folder (config.json, model.safetensors)")
    if len(folders) == 1:
        _check_folder(folders[0])
    given = [f"--config=lm:init={folders[0]}"] if len(folders) == 1 else []
    argv = cli.config_argv([sys.argv[0], *given, *(a for a in sys.argv[1:] if a not in folders)])
    config = config_flags.DEFINE_config_file(
        "config", None, "Set from HF_DIR (lm:init=HF_DIR); override its fields with --config.*.", lock_config=True, sys_argv=argv
    )
    workdir = flags.DEFINE_string("workdir", None, "Directory of the imported run (a new one, or this import's).")
    flags.mark_flags_as_required(["workdir"])

    def run(_):
        from freeatten_jax.training import loop

        if len(folders) != 1:
            raise UserError(f"give one Hugging Face model folder (got {len(folders)}): freeatten-import HF_DIR --workdir=DIR")
        from freeatten_jax.training import warm_start

        try:
            preempted = loop.train_and_evaluate(cli.config_value(config), workdir.value, initialise_only=True).preempted
        except warm_start.WarmStartError as e:  # named by this command's HF_DIR, not the config field it fills in
            raise UserError(str(e).replace(f"config.init.path={folders[0]}: ", f"{folders[0]}: ", 1)) from None
        if preempted:
            sys.exit(EXIT_PREEMPTED)  # a signal before checkpoint 0 was written: rerun to import
        print(f"imported {folders[0]} as checkpoint 0 of {workdir.value}")

    cli.run(run, argv)
