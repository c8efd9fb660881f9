"""Shared test helpers; how the suite is split (sample by default, full campaigns on demand): docs/testing.md."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LLAMA_SRC = REPO / "third_party" / "llama.cpp" / "src"

# The one switch between the suite's samples and the full campaigns (docs/testing.md). Unset, the suite
# runs a deterministic sample (every architecture, weight type and gate configuration at least once);
# BMOE_EDGE_FULL_CAMPAIGNS=1 adds every test marked `full_campaign` (the whole gate matrix, the repeated
# runs under qemu, the long campaigns) and makes the bounded campaigns run at their full size.
FULL_CAMPAIGNS = os.environ.get("BMOE_EDGE_FULL_CAMPAIGNS") == "1"


def campaign_size(sample: int, full: int) -> int:
    """How many rounds a bounded campaign runs: `sample` in the default suite, `full` with
    BMOE_EDGE_FULL_CAMPAIGNS=1."""
    return full if FULL_CAMPAIGNS else sample


# The session fixtures of the board tests: the emulated board and its lab, the bundles built once per
# session. With pytest-xdist (scripts/test.sh runs one worker per core) every test that uses one runs in
# the same worker, in order, as it would alone; every other module is one unit of its own (its module
# fixtures made once).
BOARD_FIXTURES = frozenset({"board", "lab", "dist", "board_bundle", "qemu_bundle"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        shares_the_board = BOARD_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group("board" if shares_the_board else item.module.__name__))
    if FULL_CAMPAIGNS:
        return
    skip = pytest.mark.skip(reason="a full campaign: BMOE_EDGE_FULL_CAMPAIGNS=1 runs it (docs/testing.md)")
    for item in items:
        if item.get_closest_marker("full_campaign"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def native():
    """bmoe_edge._native, the engine. A missing or broken build fails the tests that need it, here and
    in CI alike, with the reason: most of the suite needs the engine anyway, so a skip would only hide
    the one line that says what is wrong."""
    try:
        from bmoe_edge import _native
    except ImportError as exc:
        pytest.fail(f"bmoe_edge._native does not import ({exc}): build it with scripts/setup.sh", pytrace=False)
    return _native


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


# ---------------------------------------------------------------------------------------------------
# Bundles: each board's bundle is cross-built once per test session and shared by every test module.


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's dist/: every bundle the tests build, side by side (as `--dist` expects)."""
    return tmp_path_factory.mktemp("dist")


@pytest.fixture(scope="session")
def board_bundle(dist: Path) -> Callable[[str], Path]:
    """`board_bundle(name)` -> dist/<name>, built through `bmoe-edge build --board NAME` as a user would,
    at most once per session (later calls return the same bundle). Tests must not change it: copy it."""
    built: dict[str, Path] = {}

    def get(board: str) -> Path:
        if board not in built:
            result = run_cli("build", "--board", board, "--out", str(dist), timeout=1800, cwd=dist)
            assert result.returncode == 0, result.stderr[-3000:]
            assert result.stdout.strip().endswith(board), result.stdout
            built[board] = dist / board
        return built[board]

    return get


@pytest.fixture(scope="session")
def qemu_bundle(board_bundle: Callable[[str], Path]) -> Path:
    """The qemu-arm64 bundle (aarch64, Cortex-A76 ISA): the build, deploy and tune tests' board."""
    return board_bundle("qemu-arm64")


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the emulated boards (real sshds on 127.0.0.1) keep their keys, homes and ssh_config."""
    return tmp_path_factory.mktemp("lab")


@pytest.fixture(scope="session")
def board(lab: Path):
    """The main emulated board, one per session: the deploy tests deploy to it, the tune tests again."""
    from bmoe_edge.fleet import emulated_board

    b = emulated_board.start(lab, "main")
    yield b
    emulated_board.stop(lab, "main")
