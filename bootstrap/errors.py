"""Errors that end a command with one clear line instead of a traceback."""


class SortieError(Exception):
    """A failure the user can act on; the CLI prints its message and exits with ``exit_code``."""

    exit_code = 1


class UsageError(SortieError):
    """Bad input (flags, configs, profiles), found before anything is started."""

    exit_code = 2
