"""`bmoe-edge doctor`: is this machine ready to build, cross-build, emulate and deploy?"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Requirement:
    tool: str          # executable looked up on PATH (or an absolute path)
    purpose: str
    apt_package: str


@dataclass(frozen=True)
class Check:
    tool: str
    purpose: str
    found: str | None
    missing_package: str | None  # the apt package to install when the tool is missing

    @property
    def fix(self) -> str | None:
        return f"apt-get install -y {self.missing_package}" if self.missing_package else None


# One row per tool; the apt package is what Debian/Ubuntu ship it in.
REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("cc", "C compiler for llama.cpp", "build-essential"),
    Requirement("c++", "C++17 compiler for the engine", "build-essential"),
    Requirement("cmake", "configure the native build", "cmake"),
    Requirement("ninja", "run the native build", "ninja-build"),
    Requirement("ccache", "make rebuilds take seconds", "ccache"),
    Requirement("patch", "apply our llama.cpp patches", "patch"),
    Requirement("aarch64-linux-gnu-gcc", "cross-compile for ARM boards", "crossbuild-essential-arm64"),
    Requirement("aarch64-linux-gnu-g++", "cross-compile for ARM boards", "crossbuild-essential-arm64"),
    Requirement("qemu-aarch64", "run ARM builds on this machine", "qemu-user"),
    Requirement("dpkg-deb", "unpack the board sysroot", "dpkg"),
    Requirement("ssh", "deploy to boards", "openssh-client"),
    Requirement("/usr/sbin/sshd", "the emulated board's SSH server (tests, demo)", "openssh-server"),
)


def _locate(tool: str) -> str | None:
    if tool.startswith("/"):
        return tool if Path(tool).exists() else None
    return shutil.which(tool)


def run_checks(requirements: tuple[Requirement, ...] = REQUIREMENTS) -> list[Check]:
    checks = []
    for req in requirements:
        found = _locate(req.tool)
        checks.append(Check(req.tool, req.purpose, found, None if found else req.apt_package))
    return checks


def install_command(checks: list[Check]) -> str | None:
    """One apt-get line that installs everything missing, or None when nothing is."""
    packages = sorted({c.missing_package for c in checks if c.missing_package})
    return f"apt-get install -y {' '.join(packages)}" if packages else None
