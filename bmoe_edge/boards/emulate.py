"""Running a bundle here: its wheels unpacked (cached by bundle id), its board Python run directly or
under qemu-user (always called explicitly: never binfmt_misc). `bmoe-edge run` and the tests use it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bmoe_edge import llama_source
from bmoe_edge.boards import bundle, sysroot
from bmoe_edge.boards.compile import tool
from bmoe_edge.boards.plan import host_arch, host_python
from bmoe_edge.boards.profiles import BoardProfile
from bmoe_edge.errors import BmoeError

RUN_SITES_KEPT = 8                 # unpacked bundles kept under ~/.cache/bmoe-edge/run/



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
    tool(prefix[0], "running the board's binaries here", "qemu-user")
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
    profile = bundle.bundle_profile(bundle_dir, manifest)
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

