"""User errors: bad input that the entry points report as one `error: ...` line (no traceback); exit codes."""

EXIT_ERROR = 1  # a user error (one `error:` line) or a failure; rerunning as is will not help
EXIT_PREEMPTED = 75  # stopped by SIGTERM/SIGINT after saving a checkpoint: rerun the same command to resume (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130  # a second Ctrl-C: stopped at once, without saving the step in progress (128 + SIGINT)
EXIT_PEER_LOST = 76  # another process of a multi-process run died or hung: restart them all to resume


class UserError(Exception):
    """Base of every error caused by the user's input (config, data, paths), not by a bug."""


class ConfigError(UserError, ValueError):
    """An invalid configuration field; the message names the field and its allowed values."""
