from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LLAMA_SRC = REPO / "third_party" / "llama.cpp" / "src"


@pytest.fixture(scope="session", autouse=True)
def _no_user_profiles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test sees a real user's tuned profiles (`bmoe-edge tune` writes them into
    ${XDG_CONFIG_HOME:-~/.config}/bmoe-edge/profiles, searched by every profile lookup): the session,
    and every CLI it starts, gets an empty $XDG_CONFIG_HOME of its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
        yield


def run_cli(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run `bmoe-edge ARGS` as a user would: a separate process, text output, no exception."""
    return subprocess.run(
        [sys.executable, "-m", "bmoe_edge", *args],
        capture_output=True, text=True, timeout=timeout, **kwargs,
    )


def assert_clean_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """An expected failure: non-zero exit, one `error:` line on stderr, no traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="session")
def vocab_gguf() -> Path:
    """A real gguf shipped with the pinned llama.cpp (vocabulary only, no tensors)."""
    path = LLAMA_SRC / "models" / "ggml-vocab-llama-spm.gguf"
    if not path.exists():
        pytest.fail(f"{path} missing: run `bmoe-edge llama fetch` (the README set-up does)")
    return path
