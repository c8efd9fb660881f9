"""Import the compiled engine with a clear error when it is missing, map its exceptions, and find the programs
installed beside it."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
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


def module_dir() -> Path | None:
    """The folder the native module was loaded from (None: a module without a file)."""
    module = getattr(load(), "__file__", None)
    return Path(module).parent if module else None


def installed_binary(name: str, missing: str) -> Path:
    """A program the build installs beside the native module (llama.cpp's rpc-server, llama-bench); a wheel
    unpacked without its file modes gets its executable bit back here. `missing`: what to do when it is not there."""
    folder = module_dir()
    path = folder / name if folder else None
    if path is None or not path.is_file():
        raise BmoeError(f"this installation has no {name} (looked for {path}): {missing}")
    if not os.access(path, os.X_OK):
        try:
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise BmoeError(f"{path} is not executable and cannot be made so ({exc.strerror})") from None
    return path


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
