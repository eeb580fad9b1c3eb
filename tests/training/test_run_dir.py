"""training/run_dir.py, called directly: WORKDIR[@STEP] names, where a warm-started run's weights came from, and a run
folder read without writing (a run read through load_run: test_eval.py)."""

import json
import shutil

import pytest

from freeatten_jax.training import checkpoint, run_dir


def test_a_step_is_split_off_a_workdir_name_only_after_an_at_sign_and_digits():
    assert run_dir.split_step("runs/a@450") == ("runs/a", 450)
    assert run_dir.split_step("runs/a") == ("runs/a", None)
    assert run_dir.split_step("gs://b/a@x@12") == ("gs://b/a@x", 12)
    assert run_dir.split_step("runs/a@latest") == ("runs/a@latest", None)


def test_the_origin_names_the_source_variant_and_step_or_the_hub_folder(tmp_path):
    assert run_dir.origin(tmp_path) == ""  # trained from scratch
    record = {"source": "runs/softmax-0@450", "source_variant": "softmax"}
    (tmp_path / run_dir.INIT_FILE).write_text(json.dumps(record))
    assert run_dir.origin(tmp_path) == "softmax@450"
    (tmp_path / run_dir.INIT_FILE).write_text(json.dumps({"source": "/hub/SmolLM2-135M", "source_variant": "softmax"}))
    assert run_dir.origin(tmp_path) == "SmolLM2-135M"
    record = {"source": "runs/smollm2@0", "source_variant": "softmax", "source_origin": "SmolLM2-135M"}  # from an import
    (tmp_path / run_dir.INIT_FILE).write_text(json.dumps(record))
    assert run_dir.origin(tmp_path) == "softmax@0 (SmolLM2-135M)"


def test_a_run_folder_is_read_without_writing_and_a_missing_checkpoint_is_one_user_error(tmp_path):
    with run_dir.reading(tmp_path) as ckpt:
        assert ckpt.all_steps() == [] and ckpt.latest_step() is None
    assert not list(tmp_path.iterdir())
    missing = f"^no checkpoint in {tmp_path / 'checkpoints'}; train it first$"
    with pytest.raises(checkpoint.CheckpointNotFoundError, match=missing):
        run_dir.load_params(tmp_path)


@pytest.fixture(scope="module")
def trained(text_glob, tmp_path_factory):
    """A tiny run with checkpoints 3 and 6 (tests damage copies of it)."""
    from helpers import tiny_config

    from freeatten_jax.training import loop

    run = tmp_path_factory.mktemp("trained") / "run"
    loop.train_and_evaluate(tiny_config("softmax", text_glob, **{"train.checkpoint_every": 3}), run)
    return run


def test_a_damaged_checkpoint_is_one_line_naming_what_is_wrong_and_the_checkpoint_before_it(trained, run_cli, tmp_path):
    """Truncated data files (all of them: the largest alone may hold only the optimizer state, which generate never
    reads, as on a fresh clone in CI): the line says which file and how it is damaged (tensorstore's message, not orbax's
    wrapper with its pybind spec), and names the checkpoint before it as WORKDIR@STEP, which then loads."""
    from freeatten_jax.cli import generate as generate_cli

    run = shutil.copytree(trained, tmp_path / "run")
    for data in (run / "checkpoints" / "6" / "state").glob("**/d/*"):  # every data file: params and optimizer state
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    code, lines = run_cli(generate_cli.main, f"--workdir={run}", "--prompt=the", "--max_new_tokens=2")
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: checkpoint step 6 in {run / 'checkpoints'} cannot be read (ValueError: ")
    assert lines[0].endswith(f"; the checkpoint before it: {run}@3") and "pybind" not in lines[0], lines
    code, lines = run_cli(generate_cli.main, f"--workdir={run}@3", "--prompt=the", "--max_new_tokens=2")
    assert code == 0 and lines[0].startswith("the"), lines
    assert run_dir.load_run(f"{run}@3").step == 3


def test_a_damaged_saved_config_is_one_line_in_every_command_that_reads_it(trained, run_cli, tmp_path):
    """Garbage in the config saved with the latest checkpoint: freeatten-eval (which reads every run's config first) and
    a warm start from the run say so in one line naming the checkpoint before it, as load_run does."""
    from freeatten_jax.cli import evaluate as eval_cli
    from freeatten_jax.training import warm_start

    run = shutil.copytree(trained, tmp_path / "run")
    (run / "checkpoints" / "6" / "config" / "metadata").write_text("garbage")
    expected = (
        f"checkpoint step 6 in {run / 'checkpoints'} cannot be read (JSONDecodeError: Expecting value: line 1 column 1 "
        f"(char 0)); the checkpoint before it: {run}@3"
    )
    assert run_cli(eval_cli.main, f"--workdir={run}", f"--out={tmp_path / 'out'}", "--quick") == (1, [f"error: {expected}"])
    with pytest.raises(warm_start.WarmStartError) as raised:
        warm_start.open_source(str(run))
    assert str(raised.value) == f"config.init.path={run}: {expected}"
    with pytest.raises(checkpoint.CheckpointNotFoundError) as raised:
        run_dir.load_params(run)
    assert str(raised.value) == expected
