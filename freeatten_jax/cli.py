"""What every console script shares: packaged config names on the command line, and user errors as one line."""
import sys
from typing import Callable

from absl import app, flags, logging

from freeatten_jax import configs
from freeatten_jax.errors import UserError


def config_argv(argv: list[str]) -> list[str]:
    """argv with `--config=lssar:tiny` turned into the packaged config file's path (file paths kept)."""
    return [f"--config={configs.resolve(a.split('=', 1)[1])}" if a.startswith("--config=") else a for a in argv]


def run(main: Callable[[list[str]], None], argv: list[str], verbosity=logging.WARNING) -> None:
    """absl's app.run of `main`; a UserError exits with status 1 and one `error: ...` line.

    Library INFO logs (orbax) drown the progress lines: `verbosity` applies unless --verbosity is given.
    """

    def wrapped(args):
        if len(args) > 1:
            raise app.UsageError(f"unexpected arguments: {args[1:]}")
        if not flags.FLAGS["verbosity"].present:
            logging.set_verbosity(verbosity)
        try:
            main(args)
        except UserError as e:
            sys.exit(f"error: {e}")

    app.run(wrapped, argv=argv)
