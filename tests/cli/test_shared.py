"""The console scripts' one-line errors (cli/shared.py): a misspelt packaged config gets a did-you-mean; a config file
path is not second-guessed."""

import pytest

from freeatten_jax.cli import train as train_cli


@pytest.mark.parametrize(
    "given, suggestion",
    [
        ("lsar:tiny", "did you mean lssar:tiny?"),
        ("ssmx", "did you mean ssmax?"),
        ("mqr:variant=lssa", "did you mean mqar:variant=lssa?"),
    ],
)
def test_a_misspelt_packaged_config_is_one_line_with_a_did_you_mean(given, suggestion, run_cli, tmp_path):
    code, lines = run_cli(train_cli.main, f"--config={given}", f"--workdir={tmp_path}")
    missing = given.partition(":")[0]
    assert code == 1 and lines[-1].startswith(
        f"error: --config: cannot load the config file: [Errno 2] No such file or directory: '{missing}'; {suggestion} ("
    ), lines


@pytest.mark.parametrize("given", ["my/lsar.py:tiny", "lsar.py", "qwertyuiop"])
def test_a_file_path_or_a_name_like_no_packaged_one_gets_no_suggestion(given, run_cli, tmp_path):
    code, lines = run_cli(train_cli.main, f"--config={given}", f"--workdir={tmp_path}")
    assert (
        code == 1 and lines[-1].startswith("error: --config: cannot load the config file: ") and "did you mean" not in lines[-1]
    )
