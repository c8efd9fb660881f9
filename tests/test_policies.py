"""The C++ policies' own unit tests, without a model and without llama.cpp: the memory budget, the
read-ahead window, the RPC layer placement and speculative drafting (native/tests/*.cpp).

They are one executable, `bmoe_policy_tests`, a target of the engine's CMake build (scripts/setup.sh
builds it into build/{wheel_tag}); the session brings it up to date first (a no-op unless a policy
or a test changed), then each case runs on its own, so a failure names its case and prints the
failed checks with both values."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO

SOURCES = REPO / "native" / "tests"
TARGET = "bmoe_policy_tests"
CASES = sorted(
    name for path in SOURCES.glob("*.cpp")
    for name in re.findall(r"^POLICY_TEST\((\w+)\)", path.read_text(), re.MULTILINE)
)


def _build_dir() -> Path:
    """The host build of this interpreter: build/{wheel_tag} (pyproject.toml's build-dir)."""
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return REPO / "build" / f"{py}-{py}-{platform}"


@pytest.fixture(scope="session")
def policy_tests() -> Path:
    build = _build_dir()
    if not (build / "CMakeCache.txt").exists():
        pytest.fail(f"no host build in {build}: run scripts/setup.sh")
    cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")
    assert cmake, "cmake not found (scripts/setup.sh installs it into the virtualenv)"
    done = subprocess.run([cmake, "--build", str(build), "--target", TARGET],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"building {TARGET} failed:\n{done.stdout[-6000:]}{done.stderr[-3000:]}"
    return build / "native" / TARGET


def test_every_case_in_the_sources_is_in_the_executable(policy_tests: Path) -> None:
    listed = subprocess.run([str(policy_tests), "--list"], capture_output=True, text=True, check=True).stdout
    assert sorted(listed.split()) == CASES
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES)
def test_policy(policy_tests: Path, case: str) -> None:
    done = subprocess.run([str(policy_tests), case], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
