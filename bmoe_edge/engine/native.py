"""Import the compiled engine with a clear error when it is missing, and map its exceptions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType

from bmoe_edge.errors import BmoeError, RequestError


def load() -> ModuleType:
    try:
        from bmoe_edge import _native
    except ImportError as exc:
        raise BmoeError(
            f"the native engine is not built or does not load here ({exc}); "
            "install the package with `pip install .` or run the README's set-up command"
        ) from None
    return _native


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """Turn the engine's expected failures into BmoeError (one line for the user): RequestError where the
    request was wrong (native.RequestError, a subclass of native.EngineError), BmoeError for the rest."""
    native = load()
    try:
        yield
    except native.RequestError as exc:
        raise RequestError(str(exc)) from None
    except native.EngineError as exc:
        raise BmoeError(str(exc)) from None
