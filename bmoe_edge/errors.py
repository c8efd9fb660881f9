"""The expected-failure type of the whole tool: the CLI prints its message as one line, no traceback."""


class BmoeError(Exception):
    """Bad input or an environment problem the user can fix; the message says what to do."""
