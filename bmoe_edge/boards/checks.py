"""Checks on a built wheel: ELF machine, highest GLIBC symbol version, NEEDED libraries, the -march
ggml-cpu was compiled with, and the expert-ready hook; each failure is a BmoeError saying what is wrong.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge import llama_source
from bmoe_edge.boards.compile import binutil
from bmoe_edge.boards.plan import BuildPlan
from bmoe_edge.errors import BmoeError, show_path

HOOK_SYMBOL = llama_source.HOOK_SYMBOL
# ELF e_machine values (elf.h) and the arch names profiles use.
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
# llama.cpp's RPC worker, installed beside the extension (`bmoe-edge rpc-worker` runs it): checked
# like the extension (ELF machine, glibc, NEEDED libraries).
RPC_SERVER = "bmoe_edge/rpc-server"
# llama.cpp's llama-bench from the same tree: an installed release's `bench` anchor (bench/llama_bench.py).
LLAMA_BENCH = "bmoe_edge/llama-bench"
# The programs the build installs beside the native module, each checked as the module is (the board's ELF,
# glibc and libraries): what each is, for the line when one is missing.
PROGRAMS = {RPC_SERVER: "llama.cpp's RPC worker", LLAMA_BENCH: "llama.cpp's llama-bench (bench's anchor)"}
# CMake cache entries that define a build (recorded in the manifest).
_FLAG_PREFIXES = ("GGML_", "LLAMA_", "BMOE_")
_FLAG_NAMES = ("CMAKE_BUILD_TYPE", "CMAKE_TOOLCHAIN_FILE", "CMAKE_C_COMPILER", "CMAKE_CXX_COMPILER",
               "CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS", "CMAKE_C_FLAGS_RELEASE", "CMAKE_CXX_FLAGS_RELEASE",
               "CMAKE_SYSTEM_PROCESSOR", "BUILD_SHARED_LIBS", "SKBUILD_SOABI", "Python_INCLUDE_DIR")





def elf_machine(path: Path) -> str:
    """The ELF header's machine, as a profile arch name (read with the standard library)."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        raise BmoeError(f"{path} is not an ELF file")
    order = "little" if head[5] == 1 else "big"
    machine = int.from_bytes(head[18:20], order)
    return ELF_MACHINES.get(machine, f"e_machine {machine}")


def version_key(v: str) -> tuple[int, ...]:
    """"2.36" -> (2, 36); the first three numbers of anything like "2.35-0ubuntu3" or "3.11.2"."""
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def glibc_versions(path: Path, plan: BuildPlan | None = None) -> list[str]:
    """Every GLIBC_x.y version the ELF file needs (from its version-needs section), sorted."""
    out = subprocess.run([binutil(plan, "readelf"), "-W", "--version-info", str(path)],
                         capture_output=True, text=True, check=True).stdout
    needs = out.split("Version needs section", 1)[-1] if "Version needs section" in out else ""
    found = set(re.findall(r"Name: GLIBC_([0-9]+(?:\.[0-9]+)+)", needs))
    return sorted(found, key=version_key)


def needed_libs(path: Path, plan: BuildPlan | None = None) -> list[str]:
    out = subprocess.run([binutil(plan, "readelf"), "-W", "-d", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def defined_symbols(archive: Path, plan: BuildPlan | None = None) -> set[str]:
    out = subprocess.run([binutil(plan, "nm"), "--defined-only", str(archive)],
                         capture_output=True, text=True, check=True).stdout
    return {parts[-1] for line in out.splitlines() if len(parts := line.split()) == 3}


def marches_used(build_dir: Path, source_part: str = "/ggml-cpu/") -> set[str]:
    """Every -march= of the compile commands of sources under `source_part` (ggml's CPU backend)."""
    path = build_dir / "compile_commands.json"
    try:
        commands = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BmoeError(f"cannot read {path} ({exc}): the build did not export compile commands") from None
    found: set[str] = set()
    seen = False
    for entry in commands:
        if source_part not in entry.get("file", ""):
            continue
        seen = True
        args = entry.get("arguments") or shlex.split(entry.get("command", ""))
        marches = [a.split("=", 1)[1] for a in args if a.startswith("-march=")]
        found.add(marches[-1] if marches else "")   # the last -march wins; "" = the compiler's default
    if not seen:
        raise BmoeError(f"{path} has no compile command for {source_part} sources")
    return found


@dataclass(frozen=True)
class BuildChecks:
    ext_name: str
    elf_machine: str
    glibc_required: str
    needed_libs: tuple[str, ...]
    march_used: str
    hook: bool


def check_build(plan: BuildPlan, wheel: Path) -> BuildChecks:
    """Everything a board needs of the wheel, checked on it and its build dir; BmoeError says what failed."""
    p = plan.profile
    expected_tail = f"-{plan.wheel_tag}.whl"
    if not wheel.name.endswith(expected_tail):
        raise BmoeError(f"{wheel.name}: the wheel is not tagged {plan.wheel_tag} (a cross build got the "
                        "host's tag)")
    with tempfile.TemporaryDirectory(prefix="bmoe-check-") as tmp, zipfile.ZipFile(wheel) as zf:
        exts = [n for n in zf.namelist() if n.endswith(".so")]
        want = f"bmoe_edge/{plan.ext_name}"
        if want not in exts:
            raise BmoeError(f"{wheel.name} has no {want} (extensions: {', '.join(exts) or 'none'}); "
                            "the extension suffix is not the board Python's")
        for program, what in PROGRAMS.items():
            if program not in zf.namelist():
                raise BmoeError(f"{wheel.name} has no {program}: the build did not install {what}")
        glibc: list[str] = []
        needed: list[str] = []
        for name in [*exts, *PROGRAMS]:
            path = Path(zf.extract(name, tmp))
            machine = elf_machine(path)
            if machine != p.arch:
                raise BmoeError(f"{name} in {wheel.name} is an ELF for {machine}, board {p.name} is {p.arch}")
            glibc += glibc_versions(path, plan)
            needed += needed_libs(path, plan)
    highest = max(glibc, key=version_key) if glibc else "0"
    if glibc and version_key(highest) > version_key(p.glibc):
        raise BmoeError(f"the binaries need GLIBC_{highest}, board {p.name} has glibc {p.glibc} "
                        f"(glibc in {show_path(p.source)}): build with an older toolchain/sysroot")
    missing = sorted(set(needed) - set(p.libs))
    if missing:
        raise BmoeError(f"the binaries need {', '.join(missing)}, which board {p.name} does not list in "
                        f"`libs` ({show_path(p.source)}): link it statically, turn the feature off, or add "
                        "the library to the profile if the board really has it")
    marches = marches_used(plan.build_dir)
    want_march = p.march or ""
    if marches != {want_march}:
        got = ", ".join(sorted(m or "(none)" for m in marches))
        raise BmoeError(f"ggml-cpu was compiled with -march={got}, board {p.name} needs "
                        f"{want_march or 'no -march'} (march in {show_path(p.source)}); delete "
                        f"{plan.build_dir} and build again")
    archive = plan.build_dir / "llama.cpp" / "ggml" / "src" / "libggml-cpu.a"
    hook = archive.is_file() and HOOK_SYMBOL in defined_symbols(archive, plan)
    if p.hook and not hook:
        raise BmoeError(f"{HOOK_SYMBOL} is not in {archive}: the llama.cpp patches are not compiled in "
                        f"(board {p.name} needs the hook; `hook: false` in its profile opts out)")
    return BuildChecks(plan.ext_name, p.arch, highest, tuple(dict.fromkeys(needed)), want_march, hook)


def cmake_flags(plan: BuildPlan, checks: BuildChecks) -> dict[str, str]:
    """The build's defining CMake cache entries, plus the ggml-cpu -march actually used."""
    flags: dict[str, str] = {}
    cache = plan.build_dir / "CMakeCache.txt"
    for line in cache.read_text(errors="replace").splitlines():
        m = re.match(r"([A-Za-z0-9_]+):[A-Z]+=(.*)$", line)
        if m and (m[1].startswith(_FLAG_PREFIXES) or m[1] in _FLAG_NAMES):
            flags[m[1]] = m[2]
    for key in ("BMOE_CPU_ARM_ARCH", "GGML_CPU_ARM_ARCH"):
        flags.setdefault(key, "")
    flags["ggml_cpu_march_used"] = checks.march_used
    flags["wheel_tag"] = plan.wheel_tag
    return dict(sorted(flags.items()))


