"""The expected-failure type of the whole tool (the CLI prints its message as one line, no traceback),
and how a path is shown in such a message."""

from pathlib import Path


class BmoeError(Exception):
    """Bad input or an environment problem the user can fix; the message says what to do."""


class RequestError(BmoeError):
    """The request itself is wrong (a sampler setting, a grammar, a schema, a prompt's tokens, a text to score):
    a client's 4xx, never the engine's fault. Every other BmoeError from the engine (a read, a decode, the model
    file changing) is the engine's."""


def show_path(path: Path | str) -> str:
    """A path for a message: relative to the working directory when under it, else absolute."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)
