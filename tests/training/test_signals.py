"""training/signals.py called directly: the first SIGINT or SIGTERM asks for a stop and says so in one line; a second
SIGINT interrupts at once; the command line turns that into one line and exit 130."""

import os
import signal

import pytest

from freeatten_jax.cli import shared
from freeatten_jax.errors import EXIT_INTERRUPTED
from freeatten_jax.training import signals


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_asks_for_a_stop_and_says_so_and_a_second_ctrl_c_interrupts(signum, capfd):
    stop = signals.StopSignal()
    try:
        os.kill(os.getpid(), signum)
        assert stop.requested and stop.name == signum.name and stop.any_process()
        assert capfd.readouterr().err == f"\n{signum.name}: stopping after this step (Ctrl-C again: at once, unsaved)\n"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert capfd.readouterr().err == ""  # the interruption is the command line's to report
    finally:
        stop.restore()


def test_an_interrupted_command_is_one_line_and_exit_130(capsys):
    def main(argv):
        raise KeyboardInterrupt

    try:
        shared.run(main, ["prog"])
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt (and its traceback) reached the user")
    except SystemExit as stopped:
        assert stopped.code == EXIT_INTERRUPTED == 130
    else:
        pytest.fail("no exit")
    assert capsys.readouterr().err.strip().splitlines() == [
        "interrupted: the step in progress was not saved (rerun the same command to resume)"
    ]
