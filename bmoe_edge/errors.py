"""The expected-failure type of the whole tool (the CLI prints its message as one line, no traceback),
and how a path is shown in such a message."""

from pathlib import Path


class BmoeError(Exception):
    """Bad input or an environment problem the user can fix; the message says what to do."""


def show_path(path: Path | str) -> str:
    """A path for a message: relative to the working directory when under it, else absolute."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)
