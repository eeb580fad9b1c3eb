"""User errors: bad input that the entry points report as one `error: ...` line (no traceback)."""


class UserError(Exception):
    """Base of every error caused by the user's input (config, data, paths), not by a bug."""


class ConfigError(UserError, ValueError):
    """An invalid configuration field; the message names the field and its allowed values."""
