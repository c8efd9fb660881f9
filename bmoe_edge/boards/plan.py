"""The build plan: everything decided from a board profile alone (no compiler, no network).

The CMake flags the profile implies, the wheel tag and extension suffix of the board's Python, the
toolchain file when the board's arch is not this machine's, the build directory (shared by boards
whose flags are identical) and the bundle directory.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge import llama_source
from bmoe_edge.boards import sysroot
from bmoe_edge.boards.profiles import BoardProfile
from bmoe_edge.errors import BmoeError, show_path

PROJECT_ROOT = llama_source.PROJECT_ROOT
TOOLCHAINS_DIR = PROJECT_ROOT / "toolchains"
BUILD_ROOT = PROJECT_ROOT / "build"
# profile arch -> (GNU triple, wheel platform suffix)
TARGETS = {
    "aarch64": ("aarch64-linux-gnu", "aarch64"),
    "x86_64": ("x86_64-linux-gnu", "x86_64"),
}


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def host_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


# ---------------------------------------------------------------------------------------------------
# The plan: everything decided from the profile alone (no compiler, no network).


@dataclass(frozen=True)
class BuildPlan:
    profile: BoardProfile
    cross: bool
    toolchain_file: Path | None
    sysroot: sysroot.Sysroot | None   # the board's userland (cross builds: its Python headers)
    soabi: str                        # e.g. cpython-311-aarch64-linux-gnu
    wheel_tag: str                    # e.g. cp311-cp311-linux_aarch64
    defines: dict[str, str]           # -Ccmake.define.K=V, except Python_INCLUDE_DIR (needs the sysroot)
    build_dir: Path
    bundle_dir: Path
    jobs: int

    @property
    def ext_name(self) -> str:
        return f"_native.{self.soabi}.so"

    def config_settings(self) -> list[str]:
        settings = [f"build-dir={self.build_dir}", f"wheel.tags={self.wheel_tag}", "wheel.platlib=true"]
        defines = dict(self.defines)
        if self.sysroot is not None:
            defines["Python_INCLUDE_DIR"] = str(self.sysroot.python_include_dir)
        settings += [f"cmake.define.{k}={v}" for k, v in defines.items()]
        return settings


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text)


def plan_build(profile: BoardProfile, out: Path = Path("dist"), jobs: int | None = None) -> BuildPlan:
    """Decide the whole build from the profile; raises BmoeError for a board this machine cannot build."""
    if profile.arch not in TARGETS:
        raise BmoeError(f"board {profile.name}: no build recipe for arch {profile.arch!r}")
    triple, plat = TARGETS[profile.arch]
    cross = profile.arch != host_arch()
    py = profile.python
    pytag = "cp" + py.replace(".", "")
    toolchain_file: Path | None = None
    if cross:
        if profile.toolchain == "native":
            raise BmoeError(f"board {profile.name} ({profile.arch}) says toolchain: native, but this machine "
                            f"is {host_arch()}: name a cross toolchain file ({show_path(profile.source)})")
        toolchain_file = TOOLCHAINS_DIR / profile.toolchain
        if not toolchain_file.is_file():
            raise BmoeError(f"board {profile.name}: toolchain file {toolchain_file} does not exist "
                            f"(toolchain: {profile.toolchain} in {show_path(profile.source)})")
    elif py != host_python():
        raise BmoeError(f"board {profile.name} runs Python {py} but this native build runs under "
                        f"Python {host_python()}: build with a {py} virtualenv")
    root = sysroot.sysroot_for(profile.arch, py) if cross else None
    defines = {
        "BMOE_HOST_NATIVE": "OFF",
        "BMOE_LLAMA_PATCHES": "ON",
        "CMAKE_EXPORT_COMPILE_COMMANDS": "ON",
        "SKBUILD_SOABI": f"cpython-{py.replace('.', '')}-{triple}",
    }
    if profile.march:
        defines["BMOE_CPU_ARM_ARCH"] = profile.march
    if toolchain_file is not None:
        defines["CMAKE_TOOLCHAIN_FILE"] = str(toolchain_file)
    # Boards whose flags are identical share one build directory (rpi5, orangepi5, rock5b, qemu-arm64:
    # all Cortex-A76 / armv8.2-a+dotprod+fp16 / Python 3.11): the wheel they get is the same.
    key = f"board-{profile.arch}-{_slug(profile.march or 'generic')}-{pytag}"
    if profile.toolchain not in ("native", "aarch64-linux-gnu.cmake"):
        key += "-" + _slug(Path(profile.toolchain).stem)
    return BuildPlan(
        profile=profile, cross=cross, toolchain_file=toolchain_file, sysroot=root,
        soabi=defines["SKBUILD_SOABI"], wheel_tag=f"{pytag}-{pytag}-linux_{plat}", defines=defines,
        build_dir=BUILD_ROOT / key, bundle_dir=Path(out).absolute() / profile.name,
        jobs=jobs or os.cpu_count() or 1,
    )


