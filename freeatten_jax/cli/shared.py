"""What every console script shares: packaged config names on the command line, and user errors as one line."""

import difflib
import os
import pathlib
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from typing import NoReturn

from absl import app, flags, logging

from freeatten_jax import configs
from freeatten_jax.cli import usage
from freeatten_jax.errors import EXIT_ERROR, EXIT_INTERRUPTED, UserError

# Raised while parsing the command line (bad flag values, config files that fail to load, unknown fields).
_ARGV_ERRORS = (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError)
# Held while a thread reports an exception it cannot raise, and while the error line is written: a report comes a piece
# of a line at a time (tensorstore's callbacks into a closed event loop, as a failed save shuts down), so without it the
# error line could start in the middle of one.
_STDERR_LOCK = threading.RLock()


def config_argv(argv: list[str]) -> list[str]:
    """argv with `--config=lssar:tiny` turned into the packaged config file's path (file paths kept)."""
    return [f"--config={configs.resolve(a.split('=', 1)[1])}" if a.startswith("--config=") else a for a in argv]


def _traceback_wanted(argv: list[str]) -> bool:
    return any(a.startswith(("--verbosity", "-v=", "--v=")) for a in argv)


def _one_line(error: BaseException, argv: list[str]) -> str:
    """The error's last meaningful line (config_flags wraps tracebacks into its messages), naming the flag at fault."""
    name = re.search(r"'(\w+)", str(error)) if isinstance(error, (AttributeError, KeyError)) else None
    at = re.compile(rf"\.{name[1]}(?=\.|$)") if name else None  # a misspelt config field or section, in its flag
    if flag := next((a.split("=")[0] for a in argv if at and a.startswith("--config.") and at.search(a.split("=")[0])), None):
        close = re.search(r'Did you mean "(\w+)"', str(error))
        return f"{flag}: no such config field" + (f"; did you mean {at.sub('.' + close[1], flag, count=1)}?" if close else "")
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = re.sub(r"^[\w.]+(Error|Exception): ", "", lines[-1] if lines else type(error).__name__)
    text = re.sub(r"^flag (--\S+): is invalid", r"\1 is invalid", text)  # absl's wording of a fields.FieldParser's error
    if "Errno 2" in text and "config" in str(error):
        return f"--config: cannot load the config file: {text}{_did_you_mean(argv)} (packaged configs: {configs.PACKAGED})"
    return text


def _did_you_mean(argv: list[str]) -> str:
    """'; did you mean lssar:tiny?' when --config's name is a misspelt packaged config's (lsar:tiny), else ''."""
    given = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), "")
    name, sep, arg = given.partition(":")
    close = difflib.get_close_matches(name, (*configs.EXPERIMENTS, *configs.NAMES), n=1)
    return f"; did you mean {close[0]}{sep}{arg}?" if close and "/" not in name and not name.endswith(".py") else ""


def config_value(holder):
    """The --config flag's ConfigDict; a config file that failed to load is a UserError (config_flags defers it)."""
    try:
        holder.value.keys()
    except OSError as e:
        raise UserError(_one_line(e.__cause__ or e, sys.argv)) from e
    return holder.value


def plugin_failure_in_one_line(record) -> bool:
    """A log filter: jax's report of an accelerator plugin that failed to load (e.g. the CUDA plugin of the [compile]
    extra on a machine without cuDNN; jax goes on with the other platforms) as one line, without its traceback."""
    if record.name.endswith("xla_bridge") and record.exc_info and str(record.msg).startswith("Jax plugin configuration error"):
        record.msg, record.args = f"{record.getMessage()}: {record.exc_info[1]} (--verbosity=1 shows the traceback)", ()
        record.exc_info = record.exc_text = None
    return True


def _console() -> bool:
    """Whether stderr is the process's own (a console script), not an in-process runner's, whose hooks and stderr stay
    as they are."""
    return sys.stderr is sys.__stderr__


def _locked(hook):
    """`hook` (an exception report's writer) under _STDERR_LOCK."""

    def locked(report):
        with _STDERR_LOCK:
            hook(report)

    return locked


def _into_a_closed_loop(report) -> bool:
    """Whether an unraisable report is a callback into a closed asyncio loop: tensorstore's, for the writes still in
    flight when a save failed and orbax closed its loop. The save's own `error:` line says what failed."""
    frames = traceback.extract_tb(report.exc_traceback)
    return (
        bool(frames)
        and pathlib.Path(frames[-1].filename).match("asyncio/base_events.py")
        and isinstance(report.exc_value, RuntimeError)
        and str(report.exc_value) == "Event loop is closed"
    )


def _unraisable(report) -> None:
    """Python's report of an exception no caller can catch, but none of a callback into a closed loop."""
    if not _into_a_closed_loop(report):
        sys.__unraisablehook__(report)


def _exit_last(line: str, code: int = EXIT_ERROR) -> NoReturn:
    """Exit `code` with `line` as the last line on stderr, a whole line. Threads that outlive a failed save (tensorstore's,
    which report asyncio errors as they shut down) write to /dev/null after it. A caller's own stderr (an in-process
    runner) is left as it is."""
    if not _console():
        print(line, file=sys.stderr)
        sys.exit(code)
    with _STDERR_LOCK:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    sys.exit(code)


def run(main: Callable[[list[str]], None], argv: list[str], verbosity=logging.WARNING) -> None:
    """absl's app.run of `main`; a bad command line or a UserError exits with status 1 and one `error: ...` line
    (with --verbosity given, the traceback instead); --help prints usage.text and exits 0.

    Library INFO logs (orbax) drown the progress lines: `verbosity` applies unless --verbosity is given.
    """

    def parse(args):
        try:
            return flags.FLAGS(args)
        except _ARGV_ERRORS as e:
            if _traceback_wanted(args):
                raise
            sys.exit(f"error: {_one_line(e, args)}")

    def wrapped(args):
        if len(args) > 1:
            sys.exit(f"error: unexpected arguments: {' '.join(args[1:])}")
        if not flags.FLAGS["verbosity"].present:
            logging.set_verbosity(verbosity)
            # orbax logs its save threads' failures with tracebacks; they reach the user as one `error:` line
            logging.get_absl_handler().addFilter(lambda record: "/orbax/" not in record.pathname)
            logging.get_absl_handler().addFilter(plugin_failure_in_one_line)
        try:
            main(args)
        except UserError as e:
            if flags.FLAGS["verbosity"].present:
                raise
            # a save that failed leaves orbax's write coroutines unawaited and their futures' errors unretrieved:
            # Python would warn of them, and asyncio log them, at exit, after the error line, which must stay the last
            # thing printed
            warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
            logging.get_absl_handler().addFilter(lambda record: record.name != "asyncio")
            _exit_last(f"error: {e}")
        except KeyboardInterrupt:
            if flags.FLAGS["verbosity"].present:
                raise
            _exit_last("interrupted: the step in progress was not saved (rerun the same command to resume)", EXIT_INTERRUPTED)

    if _console():
        sys.unraisablehook, threading.excepthook = _locked(_unraisable), _locked(threading.__excepthook__)
    if any(a in usage.HELP_FLAGS for a in argv[1:]):
        try:
            print(usage.text(main.__module__, argv))
        except _ARGV_ERRORS + (UserError,) as e:
            sys.exit(f"error: {_one_line(e, argv)}")
        sys.exit(0)
    app.run(wrapped, argv=argv, flags_parser=parse)
