"""`bmoe-edge build --board X`: a verified bundle for a board.

The build, in order (docs/boards.md, "Building for a board"):

1. resolve the board profile: a malformed profile fails here, before any compiler runs;
2. plan (bmoe_edge.boards.plan): the CMake flags, the wheel tag and extension suffix of the board's
   Python, the toolchain file when the board's arch is not this machine's, the build directory;
3. fetch the pinned, patched llama.cpp (a no-op when its stamp matches), make the board sysroot
   (cross builds: the target's Python headers);
4. compile (bmoe_edge.boards.compile): `pip wheel --no-build-isolation` through scikit-build-core in a
   persistent build directory shared by boards whose flags are identical, ccache on;
5. check the output (bmoe_edge.boards.checks): ELF machine, GLIBC versions, NEEDED libraries, -march,
   the hook;
6. assemble `dist/<board>/`: the wheel, the runtime-dependency wheels for the board (`pip download`
   with the board's platform and Python), the launcher rendered from `deploy/`, the quick-gate
   fixtures, the resolved profile (`profile/<board>.yaml`), and `manifest.json`
   (bmoe_edge.boards.bundle); then verify the bundle as a board would.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from bmoe_edge import __version__, llama_source
from bmoe_edge.boards import bundle, profiles, signing, sysroot
from bmoe_edge.boards.checks import LLAMA_BENCH, RPC_SERVER, BuildChecks, check_build, cmake_flags
from bmoe_edge.boards.compile import binutil, compile_wheel, compilers, locked
from bmoe_edge.boards.plan import PROJECT_ROOT, TARGETS, BuildPlan, plan_build
from bmoe_edge.boards.profiles import BoardProfile
from bmoe_edge.errors import BmoeError, show_path
from bmoe_edge.synthetic import specs

DEPLOY_DIR = PROJECT_ROOT / "deploy"



def runtime_requirements() -> list[str]:
    with open(PROJECT_ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def _constraints(lock: Path, *, update: bool) -> list[str]:
    """Pin each dependency to the version the wheel lock names, so a build takes what was reviewed
    whatever PyPI released since or this machine's venv installed; a dependency the lock does not
    name (and every one under `--update-lock`) to what this machine's environment runs and tests."""
    from importlib import metadata

    pins = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and dist.version and canonicalize_name(name) != "bmoe-edge":
            pins[canonicalize_name(name)] = f"{name}=={dist.version}"
    if not update:
        newest: dict[str, tuple[Version, str]] = {}
        for wheel in _read_lock(lock):
            try:
                key, version, _, _ = parse_wheel_filename(wheel)
            except InvalidWheelFilename:
                raise BmoeError(f"{lock}: {wheel!r} is not a wheel file name") from None
            if key not in newest or version > newest[key][0]:
                newest[key] = (version, f"{wheel.partition('-')[0]}=={version}")
        pins.update((key, pin) for key, (_, pin) in newest.items())
    return sorted(pins.values())


def platform_tags(profile: BoardProfile) -> list[str]:
    """pip --platform tags the board accepts: manylinux up to its glibc, and plain linux."""
    plat = TARGETS[profile.arch][1]
    minor = int(profile.glibc.split(".")[1])
    tags = [f"manylinux_2_{m}_{plat}" for m in range(minor, 16, -1)]
    tags += [f"manylinux2014_{plat}", f"linux_{plat}"]
    return tags


WHEEL_LOCK = "board-wheels.lock"   # at the top of the checkout: every dependency wheel a build took, by sha256


def _read_lock(lock: Path) -> dict[str, str]:
    """The wheel lock's `<sha256>  <wheel file name>` lines, by wheel file name (none without a lock)."""
    pinned: dict[str, str] = {}
    if lock.is_file():
        for n, line in enumerate(lock.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip() and not line.startswith("#"):
                digest, _, name = line.partition("  ")
                if len(digest) != 64 or not name:
                    raise BmoeError(f"{lock}, line {n}: expected `<sha256>  <wheel>`")
                pinned[name.strip()] = digest
    return pinned


def check_wheel_lock(lock: Path, wheels: Sequence[Path], log: Callable[[str], None] = print, *,
                     update: bool = False) -> None:
    """Dependency wheels pinned by hash: a wheel the lock names must have its sha256 (a wheel replaced
    on the index or in the cache is refused), and a wheel it does not name is refused too — a changed
    build environment or index would otherwise pin a new version silently — unless `update`
    (`build --update-lock`): then it is added and the lock written, to be reviewed and committed.
    Lines: `<sha256>  <wheel file name>`."""
    pinned = _read_lock(lock)
    added = []
    for wheel in wheels:
        digest = llama_source.sha256_file(wheel)
        if wheel.name not in pinned:
            if not update:
                raise BmoeError(f"dependency wheel {wheel.name} is not in {lock.name}: refusing it (a changed "
                                "dependency, index or build environment); check it, then run the build again "
                                "with --update-lock and commit the lock")
            pinned[wheel.name] = digest
            added.append(wheel.name)
        elif pinned[wheel.name] != digest:
            raise BmoeError(f"dependency wheel {wheel.name} has sha256 {digest[:16]}..., {lock.name} pins "
                            f"{pinned[wheel.name][:16]}...: refusing it (a changed upload or a tampered cache; "
                            f"delete the wheel from {wheel.parent} to fetch it again)")
    if added:
        lock.write_text("# Dependency wheels of board bundles, pinned by sha256 (`bmoe-edge build --update-lock` "
                        "adds new ones).\n"
                        + "".join(f"{d}  {n}\n" for n, d in sorted(pinned.items())), encoding="utf-8")
        log(f"{lock.name}: pinned {', '.join(added)}")


def dependency_wheels(profile: BoardProfile, log: Callable[[str], None] = print, *,
                      update_lock: bool = False) -> list[Path]:
    """The board's runtime-dependency wheels (cached by requirement set, platform and Python), each
    checked against the wheel lock (added to it with `update_lock`)."""
    lock = PROJECT_ROOT / WHEEL_LOCK
    wheels = _download_wheels(profile, _constraints(lock, update=update_lock), log)
    check_wheel_lock(lock, wheels, log, update=update_lock)
    return wheels


def _download_wheels(profile: BoardProfile, constraints: Sequence[str],
                     log: Callable[[str], None] = print) -> list[Path]:
    py = profile.python.replace(".", "")
    requirements = runtime_requirements()
    tags = platform_tags(profile)
    key = hashlib.sha256(json.dumps([requirements, list(constraints), tags, py]).encode()).hexdigest()[:16]
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
    out = []
    quick = specs.quick_fixture_specs()
    log(f"adding {len(quick)} quick-gate fixtures")
    for spec in quick:
        specs.copy_fixture(spec, dest_dir)
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
    update_lock: bool = False,
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
    with locked(plan.build_dir.parent / f".{plan.build_dir.name}.lock"):
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
        for dep in dependency_wheels(profile, say, update_lock=update_lock):
            shutil.copyfile(dep, wheels_dir / dep.name)
            deps.append(f"{bundle.WHEELS_DIR}/{dep.name}")
        render_launcher(profile, plan.sysroot, staging / bundle.LAUNCHER_DIR)
        fx = add_fixtures(staging / bundle.FIXTURES_DIR, say) if fixtures else []
        profile_file = staging / bundle.profile_path(profile.name)
        profile_file.parent.mkdir()
        profile_file.write_text(profiles.profile_file_text(profile), encoding="utf-8")
        pin = llama_source.read_pin()
        patches = tuple({"name": p.name, "sha256": llama_source.sha256_file(p)}
                        for p in llama_source.patch_files())
        extra: dict[str, object] = {"build_dir": show_path(plan.build_dir), "cross": plan.cross,
                                    "soabi": plan.soabi, "extension": f"bmoe_edge/{checks.ext_name}",
                                    "rpc_server": RPC_SERVER, "llama_bench": LLAMA_BENCH, "hook": checks.hook,
                                    # signed with the rest: a board refuses an older bundle over a newer one
                                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if plan.sysroot is not None:
            extra["sysroot"] = {"release": plan.sysroot.release, "arch": plan.sysroot.arch,
                                "path": str(plan.sysroot.path),
                                "packages": sysroot.package_versions(plan.sysroot)}
        extra["site_sha256"] = bundle.site_digest(staging, [f"{bundle.WHEELS_DIR}/{wheel.name}", *deps])
        manifest = bundle.write_manifest(
            staging, board=profile.name, arch=profile.arch, profile=bundle.profile_path(profile.name),
            python=profile.python, glibc_required=checks.glibc_required, needed_libs=checks.needed_libs,
            llama=bundle.LlamaPin(pin.version, pin.sha256, pin.upstream_commit, patches),
            compilers=comp, cmake_flags=flags, bmoe_edge_version=__version__,
            wheel=f"{bundle.WHEELS_DIR}/{wheel.name}", dependency_wheels=deps, fixtures=fx, extra=extra,
        )
        bundle.verify_bundle(staging)
        signing.sign_bundle(staging)
        _replace_dir(staging, plan.bundle_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    seconds = time.monotonic() - started
    say(f"bundle {manifest.bundle_id} -> {show_path(plan.bundle_dir)} ({seconds:.0f} s, "
        f"compile {compile_seconds:.0f} s)")
    return BuildResult(plan, manifest, plan.bundle_dir, checks, seconds, compile_seconds)


