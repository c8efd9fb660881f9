"""The native build: the hook is compiled in, and the stock-upstream build still works without it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from bmoe_edge.synthetic import tinymoe

from conftest import REPO

HOOK = "ggml_cpu_set_expert_ready_hook"


def defined_symbols(archive: Path) -> set[str]:
    out = subprocess.run(["nm", "--defined-only", str(archive)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if len(line.split()) == 3}


def test_hook_symbol_is_in_the_built_ggml_cpu() -> None:
    archives = sorted(REPO.glob("build/cp*/llama.cpp/ggml/src/libggml-cpu.a"))
    assert archives, "no host build found under build/: run the README set-up"
    assert HOOK in defined_symbols(archives[0])


def test_native_module_reports_the_hook() -> None:
    from bmoe_edge import _native

    info = _native.build_info()
    assert info.expert_ready_hook is True
    assert info.llama_pin == "llama-cpp-python==0.3.36"


@pytest.mark.slow
def test_stock_upstream_build_succeeds_without_the_hook(tmp_path: Path) -> None:
    """Patches off: the same project builds against stock llama.cpp and says the hook is absent."""
    build_dir = REPO / "build" / "stock"
    env = dict(os.environ, CCACHE_BASEDIR=str(REPO), CCACHE_NOHASHDIR="1")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
         "-w", str(tmp_path / "wheel"),
         f"-Cbuild-dir={build_dir}",
         "-Ccmake.define.BMOE_LLAMA_PATCHES=OFF",
         str(REPO)],
        check=True, env=env, capture_output=True, text=True, timeout=1500,
    )
    wheel = next((tmp_path / "wheel").glob("bmoe_edge-*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    assert HOOK not in defined_symbols(build_dir / "llama.cpp" / "ggml" / "src" / "libggml-cpu.a")
    # -S: no .pth files, so the editable install's import hook cannot shadow the stock wheel; the
    # venv's site-packages is still on the path (after the wheel) for typer and friends.
    isolated = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{sysconfig.get_paths()['purelib']}")
    where = subprocess.run(
        [sys.executable, "-S", "-c", "import bmoe_edge; print(bmoe_edge.__file__)"],
        capture_output=True, text=True, env=isolated, cwd=tmp_path, check=True,
    ).stdout
    assert where.startswith(str(site)), "the test must exercise the stock wheel, not the editable install"
    result = subprocess.run(
        [sys.executable, "-S", "-m", "bmoe_edge", "--version"], capture_output=True, text=True,
        env=isolated, cwd=tmp_path, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "hook: no" in result.stdout

    # Overlap needs the hook: a clear error that says how to get it. Everything else still works.
    model = str(tinymoe.fixture("qwen3moe", "Q8_0"))
    overlap = subprocess.run(
        [sys.executable, "-S", "-m", "bmoe_edge", "generate", "-m", model, "-p", "Hi", "-n", "2", "--overlap"],
        capture_output=True, text=True, env=isolated, cwd=tmp_path, timeout=120,
    )
    assert overlap.returncode == 1 and "Traceback" not in overlap.stderr
    assert "expert-ready hook" in overlap.stderr and "BMOE_LLAMA_PATCHES" in overlap.stderr
    serial = subprocess.run(
        [sys.executable, "-S", "-m", "bmoe_edge", "generate", "-m", model, "-p", "Hi", "-n", "2", "--no-overlap"],
        capture_output=True, text=True, env=isolated, cwd=tmp_path, timeout=120,
    )
    assert serial.returncode == 0, serial.stderr
