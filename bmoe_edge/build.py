"""`bmoe-edge build --board X`: a verified bundle for a board; `bmoe-edge run`: run a bundle under qemu.

The build, in order (docs/boards.md, "Building for a board"):

1. resolve the board profile: a malformed profile fails here, before any compiler runs;
2. plan: the CMake flags the profile implies, the wheel tag and extension suffix of the board's Python,
   the toolchain file when the board's arch is not this machine's, and the build directory;
3. fetch the pinned, patched llama.cpp (a no-op when its stamp matches), make the board sysroot
   (cross builds: the target's Python headers);
4. `pip wheel --no-build-isolation` through scikit-build-core with `-C` settings, in a persistent build
   directory (`build/board-<arch>-<march>-cp<py>/`, shared by boards whose flags are identical, e.g.
   rpi5 and qemu-arm64), ccache on, the full log in `<build dir>/build.log` and a live tail on screen;
5. check the output (ELF machine, highest GLIBC symbol version, NEEDED libraries, the -march actually
   used, the hook), failing with a BmoeError that says what is wrong;
6. assemble `dist/<board>/`: the wheel, the runtime-dependency wheels for the board (`pip download`
   with the board's platform and Python), the launcher rendered from `deploy/`, the quick-gate
   fixtures, and `manifest.json` (bmoe_edge.bundle); then verify the bundle as a board would.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from bmoe_edge import __version__, bundle, llama_source, profiles, sysroot
from bmoe_edge.errors import BmoeError
from bmoe_edge.profiles import BoardProfile

PROJECT_ROOT = llama_source.PROJECT_ROOT
TOOLCHAINS_DIR = PROJECT_ROOT / "toolchains"
DEPLOY_DIR = PROJECT_ROOT / "deploy"
BUILD_ROOT = PROJECT_ROOT / "build"
LOG_NAME = "build.log"
HOOK_SYMBOL = llama_source.HOOK_SYMBOL
RUN_SITES_KEPT = 8                 # unpacked bundles kept under ~/.cache/bmoe-edge/run/
REPRODUCIBLE_EPOCH = "315619200"   # 1980-01-02: zip's earliest date, for every entry of the wheel

# ELF e_machine values (elf.h) and the arch names profiles use.
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
# profile arch -> (GNU triple, wheel platform suffix, binutils prefix when it is not this machine)
TARGETS = {
    "aarch64": ("aarch64-linux-gnu", "aarch64"),
    "x86_64": ("x86_64-linux-gnu", "x86_64"),
}
# CMake cache entries that define a build (recorded in the manifest).
_FLAG_PREFIXES = ("GGML_", "LLAMA_", "BMOE_")
_FLAG_NAMES = ("CMAKE_BUILD_TYPE", "CMAKE_TOOLCHAIN_FILE", "CMAKE_C_COMPILER", "CMAKE_CXX_COMPILER",
               "CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS", "CMAKE_C_FLAGS_RELEASE", "CMAKE_CXX_FLAGS_RELEASE",
               "CMAKE_SYSTEM_PROCESSOR", "BUILD_SHARED_LIBS", "SKBUILD_SOABI", "Python_INCLUDE_DIR")


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
                            f"is {host_arch()}: name a cross toolchain file ({_show(profile.source)})")
        toolchain_file = TOOLCHAINS_DIR / profile.toolchain
        if not toolchain_file.is_file():
            raise BmoeError(f"board {profile.name}: toolchain file {toolchain_file} does not exist "
                            f"(toolchain: {profile.toolchain} in {_show(profile.source)})")
    elif py != host_python():
        raise BmoeError(f"board {profile.name} runs Python {py} but this native build runs under "
                        f"Python {host_python()}: build with a {py} virtualenv")
    root = sysroot.sysroot_for(profile.arch, py) if cross else None
    defines = {
        "BMOE_WITH_COMMON": "OFF",   # the engine does not use llama-common yet: halves a cold build
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


def _show(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------------
# Tools and the compile step.


def _tool(name: str, why: str, package: str) -> str:
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
        exe = _tool(name, f"the {plan.profile.arch} {lang} compiler", package)
        first = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.splitlines()
        out[lang] = first[0].strip() if first else name
    return out


def binutil(plan: BuildPlan | None, name: str) -> str:
    """readelf/nm/objdump able to read the target's objects (the cross ones when there are)."""
    if plan is not None and plan.cross:
        cross = shutil.which(f"{TARGETS[plan.profile.arch][0]}-{name}")
        if cross:
            return cross
    return _tool(name, "inspecting the built binaries", "binutils")


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
def _locked(path: Path) -> Iterator[None]:
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
        f"{_show(plan.build_dir)}; full log: {_show(log_path)}")
    rc = _run_logged(cmd, log_path, env, f"build {plan.profile.name}", quiet=quiet)
    if rc != 0:
        raise BmoeError(f"the build of {plan.profile.name} failed (exit {rc}); full log: {log_path}\n"
                        f"{_log_tail(log_path)}")
    wheels = sorted(wheelhouse.glob("*.whl"))
    if len(wheels) != 1:
        raise BmoeError(f"the build left {len(wheels)} wheels in {wheelhouse}, expected one")
    return wheels[0]


# ---------------------------------------------------------------------------------------------------
# Checks on the output.


def elf_machine(path: Path) -> str:
    """The ELF header's machine, as a profile arch name (read with the standard library)."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        raise BmoeError(f"{path} is not an ELF file")
    order = "little" if head[5] == 1 else "big"
    machine = int.from_bytes(head[18:20], order)
    return ELF_MACHINES.get(machine, f"e_machine {machine}")


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def glibc_versions(path: Path, plan: BuildPlan | None = None) -> list[str]:
    """Every GLIBC_x.y version the ELF file needs (from its version-needs section), sorted."""
    out = subprocess.run([binutil(plan, "readelf"), "-W", "--version-info", str(path)],
                         capture_output=True, text=True, check=True).stdout
    needs = out.split("Version needs section", 1)[-1] if "Version needs section" in out else ""
    found = set(re.findall(r"Name: GLIBC_([0-9]+(?:\.[0-9]+)+)", needs))
    return sorted(found, key=_version_key)


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
    """The checks of issue 5 on the built wheel and build dir; BmoeError says which one failed."""
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
        glibc: list[str] = []
        needed: list[str] = []
        for name in exts:
            path = Path(zf.extract(name, tmp))
            machine = elf_machine(path)
            if machine != p.arch:
                raise BmoeError(f"{name} in {wheel.name} is an ELF for {machine}, board {p.name} is {p.arch}")
            glibc += glibc_versions(path, plan)
            needed += needed_libs(path, plan)
    highest = max(glibc, key=_version_key) if glibc else "0"
    if glibc and _version_key(highest) > _version_key(p.glibc):
        raise BmoeError(f"the binaries need GLIBC_{highest}, board {p.name} has glibc {p.glibc} "
                        f"(glibc in {_show(p.source)}): build with an older toolchain/sysroot")
    missing = sorted(set(needed) - set(p.libs))
    if missing:
        raise BmoeError(f"the extension needs {', '.join(missing)}, which board {p.name} does not list in "
                        f"`libs` ({_show(p.source)}): link it statically, turn the feature off, or add "
                        "the library to the profile if the board really has it")
    marches = marches_used(plan.build_dir)
    want_march = p.march or ""
    if marches != {want_march}:
        got = ", ".join(sorted(m or "(none)" for m in marches))
        raise BmoeError(f"ggml-cpu was compiled with -march={got}, board {p.name} needs "
                        f"{want_march or 'no -march'} (march in {_show(p.source)}); delete "
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


# ---------------------------------------------------------------------------------------------------
# The bundle.


def runtime_requirements() -> list[str]:
    with open(PROJECT_ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def _constraints() -> list[str]:
    """Pin every dependency to what this machine's environment runs (and tests) when it has it."""
    from importlib import metadata

    pins = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and dist.version and name.lower().replace("_", "-") != "bmoe-edge":
            pins[name.lower()] = f"{name}=={dist.version}"
    return sorted(pins.values())


def platform_tags(profile: BoardProfile) -> list[str]:
    """pip --platform tags the board accepts: manylinux up to its glibc, and plain linux."""
    plat = TARGETS[profile.arch][1]
    minor = int(profile.glibc.split(".")[1])
    tags = [f"manylinux_2_{m}_{plat}" for m in range(minor, 16, -1)]
    tags += [f"manylinux2014_{plat}", f"linux_{plat}"]
    return tags


def dependency_wheels(profile: BoardProfile, log: Callable[[str], None] = print) -> list[Path]:
    """The board's runtime-dependency wheels (cached by requirement set, platform and Python)."""
    py = profile.python.replace(".", "")
    requirements = runtime_requirements()
    constraints = _constraints()
    tags = platform_tags(profile)
    key = hashlib.sha256(json.dumps([requirements, constraints, tags, py]).encode()).hexdigest()[:16]
    cache = llama_source.cache_dir() / "wheels" / f"{profile.arch}-cp{py}-{key}"
    done = cache / ".complete"
    if done.is_file():
        return sorted(cache.glob("*.whl"))
    log(f"downloading the runtime dependencies for {profile.arch} Python {profile.python}: "
        f"{', '.join(requirements)}")
    cache.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache.parent, prefix=f".{cache.name}-"))
    try:
        (staging / "constraints.txt").write_text("\n".join(constraints) + "\n")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
               "--python-version", profile.python, "--implementation", "cp",
               "--abi", f"cp{py}", "--abi", "abi3", "--abi", "none",
               *(a for t in tags for a in ("--platform", t)),
               "-c", str(staging / "constraints.txt"), "-d", str(staging), *requirements]
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
        result = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            tail = [ln for ln in result.stderr.splitlines() if ln.strip()][-3:]
            raise BmoeError(f"pip download of the board's dependencies failed: {' | '.join(tail)}")
        (staging / "constraints.txt").unlink()
        (staging / ".complete").write_text(json.dumps({"requirements": requirements, "tags": tags}) + "\n")
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(staging, cache)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(cache.glob("*.whl"))


def render_launcher(profile: BoardProfile, root: sysroot.Sysroot | None, dest_dir: Path) -> list[Path]:
    """Copy deploy/ into the bundle's launcher/, filling the @...@ placeholders of its text files."""
    if root is not None and profile.exec_wrapper:
        python = '"$sysroot"/' + str(root.python_exe.relative_to(root.path))
        words = []
        for arg in profile.exec_wrapper:
            if re.search(r"[\"`$\\]", arg.replace("{sysroot}", "")):
                raise BmoeError(f"exec_wrapper argument {arg!r} of {profile.name} cannot be put in a shell script")
            words.append('"' + arg.replace("{sysroot}", '${sysroot}') + '"' if "{sysroot}" in arg
                         else shlex.quote(arg))
        prefix = " ".join(words) + " "
        sysroot_default = shlex.quote(str(root.path))
    else:
        python = f"python{profile.python}"
        prefix = ""
        sysroot_default = "''"
    values = {"@BOARD@": profile.name, "@PYTHON@": python, "@EXEC_PREFIX@": prefix,
              "@SYSROOT@": sysroot_default}
    if not DEPLOY_DIR.is_dir():
        raise BmoeError(f"{DEPLOY_DIR} is missing: the launcher templates live in the checkout's deploy/")
    out = []
    for src in sorted(p for p in DEPLOY_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        dest = dest_dir / src.relative_to(DEPLOY_DIR)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            text = src.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            shutil.copyfile(src, dest)
        else:
            for key, value in values.items():
                text = text.replace(key, value)
            dest.write_text(text, encoding="utf-8")
        dest.chmod(0o755 if os.access(src, os.X_OK) or src.suffix == ".sh" else 0o644)
        out.append(dest)
    return out


def add_fixtures(dest_dir: Path, log: Callable[[str], None] = print) -> list[bundle.Fixture]:
    """The quick-gate fixtures, generated (cached) on this machine and copied under their bundle names."""
    try:
        from bmoe_edge import gates
    except ImportError as exc:
        log(f"warning: no quick-gate fixtures in the bundle (bmoe_edge.gates: {exc})")
        return []
    out = []
    specs = gates.quick_fixture_specs()
    log(f"adding {len(specs)} quick-gate fixtures")
    for spec in specs:
        dest_dir.mkdir(parents=True, exist_ok=True)
        # copies, not hard links: a bundle file changed later must not change the host's cache
        for src, name in zip(gates.host_fixture_paths(spec), spec.filenames, strict=True):
            shutil.copyfile(src, dest_dir / name)
        out.append(bundle.Fixture(spec.arch, spec.quant, spec.split,
                                  tuple(f"{bundle.FIXTURES_DIR}/{n}" for n in spec.filenames)))
    return out


def _replace_dir(staging: Path, dest: Path) -> None:
    if dest.is_symlink() or dest.is_file():
        raise BmoeError(f"{dest} exists and is not a directory: remove it")
    if dest.exists():
        retired = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old-"))
        os.replace(dest, retired / dest.name)
        shutil.rmtree(retired, ignore_errors=True)
    os.replace(staging, dest)


@dataclass(frozen=True)
class BuildResult:
    plan: BuildPlan
    manifest: bundle.Manifest
    bundle_dir: Path
    checks: BuildChecks
    seconds: float
    compile_seconds: float


def build_board(
    board: str | BoardProfile,
    *,
    out: Path = Path("dist"),
    jobs: int | None = None,
    profile_dirs: Sequence[Path] | None = None,
    fixtures: bool = True,
    quiet: bool = False,
    log: Callable[[str], None] | None = None,
) -> BuildResult:
    """Build `dist/<board>/` for a board name (or an already resolved profile); see the module doc."""
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    started = time.monotonic()
    profile = board if isinstance(board, BoardProfile) else profiles.load_profile(board, profile_dirs)
    plan = plan_build(profile, out, jobs)
    if not (PROJECT_ROOT / "CMakeLists.txt").is_file():
        raise BmoeError(f"building needs the bmoe-edge source checkout ({PROJECT_ROOT} has no CMakeLists.txt)")
    comp = compilers(plan)
    binutil(plan, "readelf")
    binutil(plan, "nm")
    try:
        llama_source.fetch()
    except llama_source.LlamaSourceError as exc:
        raise BmoeError(str(exc)) from None
    if plan.sysroot is not None:
        sysroot.ensure_sysroot(plan.sysroot, log=say)
    with _locked(plan.build_dir.parent / f".{plan.build_dir.name}.lock"):
        t0 = time.monotonic()
        wheel = compile_wheel(plan, quiet=quiet, log=say)
        compile_seconds = time.monotonic() - t0
        checks = check_build(plan, wheel)
        flags = cmake_flags(plan, checks)
        plan.bundle_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=plan.bundle_dir.parent, prefix=f".{profile.name}.new-"))
        try:
            wheels_dir = staging / bundle.WHEELS_DIR
            wheels_dir.mkdir()
            shutil.copyfile(wheel, wheels_dir / wheel.name)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    try:
        deps = []
        for dep in dependency_wheels(profile, say):
            shutil.copyfile(dep, wheels_dir / dep.name)
            deps.append(f"{bundle.WHEELS_DIR}/{dep.name}")
        render_launcher(profile, plan.sysroot, staging / bundle.LAUNCHER_DIR)
        fx = add_fixtures(staging / bundle.FIXTURES_DIR, say) if fixtures else []
        pin = llama_source.read_pin()
        patches = tuple({"name": p.name, "sha256": llama_source.sha256_file(p)}
                        for p in llama_source.patch_files())
        extra: dict[str, object] = {"build_dir": _show(plan.build_dir), "cross": plan.cross,
                                    "soabi": plan.soabi, "extension": f"bmoe_edge/{checks.ext_name}",
                                    "hook": checks.hook}
        if plan.sysroot is not None:
            extra["sysroot"] = {"release": plan.sysroot.release, "arch": plan.sysroot.arch,
                                "path": str(plan.sysroot.path),
                                "packages": sysroot.package_versions(plan.sysroot)}
        manifest = bundle.write_manifest(
            staging, board=profile.name, arch=profile.arch, profile=profile.to_dict(),
            python=profile.python, glibc_required=checks.glibc_required, needed_libs=checks.needed_libs,
            llama=bundle.LlamaPin(pin.version, pin.sha256, pin.upstream_commit, patches),
            compilers=comp, cmake_flags=flags, bmoe_edge_version=__version__,
            wheel=f"{bundle.WHEELS_DIR}/{wheel.name}", dependency_wheels=deps, fixtures=fx, extra=extra,
        )
        bundle.verify_bundle(staging)
        _replace_dir(staging, plan.bundle_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    seconds = time.monotonic() - started
    say(f"bundle {manifest.bundle_id} -> {_show(plan.bundle_dir)} ({seconds:.0f} s, compile {compile_seconds:.0f} s)")
    return BuildResult(plan, manifest, plan.bundle_dir, checks, seconds, compile_seconds)


# ---------------------------------------------------------------------------------------------------
# Running a bundle under emulation (qemu-user, always called explicitly: never binfmt_misc).


def _profile_of(manifest: bundle.Manifest) -> BoardProfile:
    """The profile a bundle was built with, as recorded in its manifest."""
    with tempfile.TemporaryDirectory(prefix="bmoe-profile-") as tmp:
        path = Path(tmp) / f"{manifest.board}.yaml"
        import yaml

        path.write_text(yaml.safe_dump(manifest.profile, sort_keys=False))
        return profiles.load_profile_file(path, dirs=[])


def emulator_prefix(profile: BoardProfile, root: sysroot.Sysroot, cpu: str | None = None) -> list[str]:
    """qemu-aarch64 -cpu <cpu> -L <sysroot>: the profile's exec_wrapper, or one made from qemu_cpu."""
    if profile.arch == host_arch():
        return profile.exec_prefix(root.path) if profile.exec_wrapper else []
    if profile.exec_wrapper:
        prefix = profile.exec_prefix(root.path)
    else:
        prefix = [f"qemu-{profile.arch}", "-cpu", profile.qemu_cpu or "max", "-L", str(root.path)]
    if cpu is not None:
        if "-cpu" in prefix:
            prefix[prefix.index("-cpu") + 1] = cpu
        else:
            prefix[1:1] = ["-cpu", cpu]
    _tool(prefix[0], "running the board's binaries here", "qemu-user")
    return prefix


def bundle_site(bundle_dir: Path, manifest: bundle.Manifest) -> Path:
    """The bundle's wheels unpacked (cached by bundle id, which is a content hash)."""
    base = llama_source.cache_dir() / "run" / manifest.bundle_id
    site = base / "site"
    if (base / ".complete").is_file() and site.is_dir():
        os.utime(base / ".complete")
        return site
    _prune_sites(base.parent, keep=RUN_SITES_KEPT - 1)
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=base, prefix=".site-"))
    try:
        bundle.install_site(bundle_dir, staging, manifest)
        shutil.rmtree(site, ignore_errors=True)
        os.replace(staging, site)
        (base / ".complete").write_text(manifest.bundle_id + "\n")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return site


def _prune_sites(runs: Path, keep: int) -> None:
    """Keep the `keep` most recently used unpacked bundles under `runs`."""
    if not runs.is_dir():
        return
    done = sorted((d for d in runs.iterdir() if (d / ".complete").is_file()),
                  key=lambda d: (d / ".complete").stat().st_mtime, reverse=True)
    for old in done[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def emulated_command(bundle_dir: Path, python_args: Sequence[str], *, cpu: str | None = None,
                     verify: bool = True) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that run the bundle's board Python with `python_args` under qemu (or natively)."""
    bundle_dir = Path(bundle_dir)
    manifest = bundle.verify_bundle(bundle_dir) if verify else bundle.load_manifest(bundle_dir)
    profile = _profile_of(manifest)
    site = bundle_site(bundle_dir, manifest)
    # PYTHONSAFEPATH: `python -m` must not put the current directory (a checkout?) before site/
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONNOUSERSITE="1", PYTHONSAFEPATH="1")
    if profile.arch == host_arch() and not profile.exec_wrapper:
        if profile.python != host_python():
            raise BmoeError(f"bundle {manifest.bundle_id} is for Python {profile.python}, this is {host_python()}")
        exe = sysconfig.get_config_var("BINDIR") + f"/python{profile.python}"
        return [exe if Path(exe).exists() else sys.executable, *python_args], env
    root = sysroot.ensure_sysroot(sysroot.sysroot_for(profile.arch, profile.python))
    return [*emulator_prefix(profile, root, cpu), str(root.python_exe), *python_args], env


def run_bundle(bundle_dir: Path, args: Sequence[str], *, cpu: str | None = None, module: bool = True,
               capture: bool = False, timeout: float | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m bmoe_edge ARGS` (or `python ARGS` with module=False) from the bundle, emulated.

    `cpu` overrides the qemu CPU model of the profile (e.g. cortex-a72 to show a Pi 5 build's SIGILL).
    A death by signal is a negative returncode (exit_code() turns it into the shell's 128 + N).
    """
    argv, env = emulated_command(bundle_dir, ["-m", "bmoe_edge", *args] if module else list(args), cpu=cpu)
    return subprocess.run(argv, env=env, text=True, capture_output=capture, timeout=timeout, cwd=cwd,
                          preexec_fn=_no_core_dumps)


def _no_core_dumps() -> None:
    # qemu-user writes qemu_*.core into the working directory when the guest dies of a signal
    # (the SIGILL test does that on purpose)
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def exit_code(returncode: int) -> int:
    """A shell's view of a child's status: death by signal N is 128 + N (SIGILL -> 132)."""
    return 128 - returncode if returncode < 0 else returncode
