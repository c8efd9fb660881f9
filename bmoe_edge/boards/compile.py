"""The compile step: the board wheel through scikit-build-core in the plan's build directory, with
a live status line and the full log in `<build dir>/build.log`; the tools it needs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from bmoe_edge.boards.plan import PROJECT_ROOT, TARGETS, BuildPlan
from bmoe_edge.errors import BmoeError, show_path

LOG_NAME = "build.log"
REPRODUCIBLE_EPOCH = "315619200"   # 1980-01-02: zip's earliest date, for every entry of the wheel



def tool(name: str, why: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BmoeError(f"{name} not found ({why}): apt-get install {package}")
    return found


def compilers(plan: BuildPlan) -> dict[str, str]:
    """The C/C++ compilers the build uses and their `--version` first line."""
    if plan.cross:
        triple = TARGETS[plan.profile.arch][0]
        names = {"c": f"{triple}-gcc", "cxx": f"{triple}-g++"}
        package = "crossbuild-essential-arm64" if plan.profile.arch == "aarch64" else f"g++-{triple}"
    else:
        names = {"c": os.environ.get("CC", "cc"), "cxx": os.environ.get("CXX", "c++")}
        package = "build-essential"
    out = {}
    for lang, name in names.items():
        exe = tool(name, f"the {plan.profile.arch} {lang} compiler", package)
        first = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.splitlines()
        out[lang] = first[0].strip() if first else name
    return out


def binutil(plan: BuildPlan | None, name: str) -> str:
    """readelf/nm/objdump able to read the target's objects (the cross ones when there are)."""
    if plan is not None and plan.cross:
        cross = shutil.which(f"{TARGETS[plan.profile.arch][0]}-{name}")
        if cross:
            return cross
    return tool(name, "inspecting the built binaries", "binutils")


@dataclass
class Progress:
    """Shows a build's log as it grows: one status line on a terminal, sparse lines otherwise."""

    title: str
    stream: TextIO | None = None   # None: show nothing
    _last_pct: int = -10
    _shown: bool = False

    def line(self, text: str) -> None:
        m = re.search(r"\[(\d+)/(\d+)\]\s*(.*)", text)
        if self.stream is None or not m:
            return
        done, total, what = int(m[1]), int(m[2]), m[3]
        what = re.sub(r"^(Building \w+ object|Linking \w+ \w+ library|Linking \w+ \w+ module) ", "", what)
        if self.stream.isatty():
            width = shutil.get_terminal_size((100, 20)).columns
            status = f"{self.title} [{done}/{total}] {what}"
            print("\r" + status[: width - 1].ljust(width - 1), end="", file=self.stream, flush=True)
            self._shown = True
        else:
            pct = 100 * done // max(total, 1)
            if pct >= self._last_pct + 10 or done == total:
                self._last_pct = pct
                print(f"{self.title}: [{done}/{total}] {what}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._shown and self.stream is not None:
            print("", file=self.stream, flush=True)


def _run_logged(cmd: Sequence[str], log_path: Path, env: Mapping[str, str], title: str,
                quiet: bool = False) -> int:
    """Run `cmd`, all its output into `log_path` (appended), with a live status from its lines."""
    progress = Progress(title, stream=None if quiet else sys.stderr)
    with open(log_path, "a", encoding="utf-8", errors="replace") as log:
        log.write(f"\n$ {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(env),
                                text=True, errors="replace", cwd=PROJECT_ROOT)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                progress.line(line)
        finally:
            rc = proc.wait()
            progress.close()
    return rc


def _log_tail(log_path: Path, n: int = 25) -> str:
    lines = [ln for ln in log_path.read_text(errors="replace").splitlines()
             if ln.strip() and not ln.startswith("WARNING: Location")]
    errors = [ln for ln in lines if re.search(r"error|Error|FAILED", ln)]
    shown = [*errors[:8], "...", *lines[-8:]] if errors else lines[-n:]
    return "\n".join(shown)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One build at a time per build directory (boards with equal flags share one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compile_wheel(plan: BuildPlan, *, quiet: bool = False, log: Callable[[str], None] = print) -> Path:
    """Build the board wheel in plan.build_dir; returns the wheel path (inside the build dir)."""
    wheelhouse = plan.build_dir / "wheelhouse"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    wheelhouse.mkdir(parents=True)
    log_path = plan.build_dir / LOG_NAME
    log_path.write_text(f"# bmoe-edge build --board {plan.profile.name} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
    env = dict(os.environ)
    env.setdefault("CCACHE_BASEDIR", str(PROJECT_ROOT))
    env.setdefault("CCACHE_NOHASHDIR", "1")
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(plan.jobs)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # Reproducible wheel: fixed zip timestamps, so an unchanged build gives the same bytes (and bundle id).
    env.setdefault("SOURCE_DATE_EPOCH", REPRODUCIBLE_EPOCH)
    # A host-native ABI hint must not leak into a cross build's tag or suffix.
    for var in ("_PYTHON_HOST_PLATFORM", "SETUPTOOLS_EXT_SUFFIX", "CMAKE_TOOLCHAIN_FILE", "CMAKE_ARGS"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v",
           "-w", str(wheelhouse), *(f"-C{s}" for s in plan.config_settings()), str(PROJECT_ROOT)]
    log(f"compiling {plan.profile.name} ({plan.profile.arch}, march {plan.profile.march or '-'}) in "
        f"{show_path(plan.build_dir)}; full log: {show_path(log_path)}")
    rc = _run_logged(cmd, log_path, env, f"build {plan.profile.name}", quiet=quiet)
    if rc != 0:
        raise BmoeError(f"the build of {plan.profile.name} failed (exit {rc}); full log: {log_path}\n"
                        f"{_log_tail(log_path)}")
    wheels = sorted(wheelhouse.glob("*.whl"))
    if len(wheels) != 1:
        raise BmoeError(f"the build left {len(wheels)} wheels in {wheelhouse}, expected one")
    return wheels[0]


