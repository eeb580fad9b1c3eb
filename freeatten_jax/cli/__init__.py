"""The command line: every console script's flags, `--help` and error layer (`shared`: a user error is one `error:`
line), on top of the library and the application; `scripts` holds the entry points."""
