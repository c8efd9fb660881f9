"""The tamper campaign (issue 27): nothing from a bundle runs before its signature holds.

Against a real sshd board (the emulated board, this machine behind 127.0.0.1) that has the session's
signed qemu-arm64 bundle A current and trusts this machine's build key, each tampering of a bundle — an
edited profile (its exec wrapper, the launcher's Python, the sysroot), a swapped wheel, an added file,
a symlink, a manifest edited and re-hashed, a manifest swapped between reads, a signature from another
key, a bundle id that does not match its release directory, an old signed bundle replayed over a newer
one, `--allow-unsigned` on a forged bundle, an unsigned one — is deployed, and must be refused before
any code from it runs on the board: the canary file its payload would create does not exist afterwards,
no tampered release was installed (no site/), `current` still points at A, verified file by file, and
`status` is clean.

The default suite runs a sample (SAMPLE: the scenario that ran its payload on the code before issue 27,
and the board's own refusal); BMOE_EDGE_FULL_CAMPAIGNS=1 runs every row and, with
BMOE_EDGE_TAMPER_TABLE=FILE, writes the result table (bench-data/2026-12-01/tamper/).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bmoe_edge.boards import bundle, signing
from bmoe_edge.fleet import deploy, emulated_board, releases, remote
from bmoe_edge.fleet import state as board_state
from bmoe_edge.fleet import targets as fleet_targets
from bmoe_edge.fleet.trust import TrustOptions
from bmoe_edge.fleet.upload import load_bundle

from conftest import FULL_CAMPAIGNS
from test_deploy import _release_ok, changed_bundle


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str                    # the tampering, for the table
    refused: str                 # a phrase of the one-line refusal
    make: Callable[[Path, Path, Path], Path]    # (bundle A, work dir, canary) -> the tampered bundle dir
    run: str = "deploy"          # how it is deployed: deploy | swap | rename | allow-unsigned


def _rehash(d: Path, **extra: object) -> Path:
    """Write d's manifest again from its files (a tamperer who re-hashes), keeping the old signature."""
    m = bundle.load_manifest(d)
    bundle.write_manifest(d, board=m.board, arch=m.arch, profile=m.profile, python=m.python,
                          glibc_required=m.glibc_required, needed_libs=m.needed_libs, llama=m.llama,
                          compilers=m.compilers, cmake_flags=m.cmake_flags, bmoe_edge_version=m.bmoe_edge_version,
                          wheel=m.wheel, dependency_wheels=m.dependency_wheels, launcher=m.launcher,
                          fixtures=m.fixtures, extra={**m.extra, **extra})
    return d


def _copy(a: Path, work: Path, name: str) -> Path:
    dest = work / name / "qemu-arm64"
    shutil.copytree(a, dest)
    return dest


def _payload(canary: Path) -> str:
    return f"touch '{canary}'"


def _launcher_payload(d: Path, canary: Path) -> None:
    launcher = d / bundle.LAUNCHER_SCRIPT
    launcher.write_text(launcher.read_text().replace("set -eu\n", f"set -eu\n{_payload(canary)}\n", 1))


def make_wrapper(a: Path, work: Path, canary: Path) -> Path:
    d = _copy(a, work, "wrapper")
    path = d / bundle.profile_path("qemu-arm64")
    profile = yaml.safe_load(path.read_text())
    profile["exec_wrapper"] = ["sh", "-c", f'{_payload(canary)}; exec "$@"', "sh", *profile["exec_wrapper"]]
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return _rehash(d)


def make_python(a: Path, work: Path, canary: Path) -> Path:
    """The launcher runs another Python: a script that runs the payload, then the real one."""
    d = _copy(a, work, "python")
    evil = work / "evil-python"
    evil.write_text(f"#!/bin/sh\n{_payload(canary)}\n")
    evil.chmod(0o755)
    launcher = d / bundle.LAUNCHER_SCRIPT
    text, n = re.subn(r"^python=.*$", f"python={evil}", launcher.read_text(), count=1, flags=re.M)
    assert n == 1
    launcher.write_text(text)
    return _rehash(d)


def make_sysroot(a: Path, work: Path, canary: Path) -> Path:
    """The manifest's sysroot (what the probe ran the board's Python from) moved to a directory on the
    board whose python3.11 is the payload (a file left there by an earlier refused upload, say)."""
    d = _copy(a, work, "sysroot")
    evil = work / "evil-sysroot"
    (evil / "usr" / "bin").mkdir(parents=True)
    (evil / "usr" / "bin" / "python3.11").write_text(f"#!/bin/sh\n{_payload(canary)}\n")
    (evil / "usr" / "bin" / "python3.11").chmod(0o755)
    m = bundle.load_manifest(d)
    return _rehash(d, sysroot={**m.extra["sysroot"], "path": str(evil)})   # type: ignore[dict-item]


def make_wheel(a: Path, work: Path, canary: Path) -> Path:
    d = _copy(a, work, "wheel")
    wheel = d / bundle.load_manifest(d).wheel
    swapped = wheel.with_suffix(".new")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(swapped, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "bmoe_edge/__main__.py":
                data = f"import os\nos.system({_payload(canary)!r})\n".encode() + data
            dst.writestr(item, data)
    swapped.replace(wheel)
    return _rehash(d)


def make_added(a: Path, work: Path, canary: Path) -> Path:
    d = _copy(a, work, "added")
    (d / "launcher" / "sitecustomize.py").write_text(f"import os\nos.system({_payload(canary)!r})\n")
    return d


def make_symlink(a: Path, work: Path, canary: Path) -> Path:
    d = _copy(a, work, "symlink")
    evil = work / "evil-job.sh"
    evil.write_text(f"#!/bin/sh\n{_payload(canary)}\n")
    job = d / "launcher" / "bmoe-edge-job.sh"
    job.unlink()
    job.symlink_to(evil)
    return d


def make_rehashed(a: Path, work: Path, canary: Path) -> Path:
    d = _copy(a, work, "rehashed")
    _launcher_payload(d, canary)
    return _rehash(d)


def make_other_key(a: Path, work: Path, canary: Path) -> Path:
    d = make_rehashed(a, work / "other", canary)
    signing.sign_bundle(d, work / "other-key" / "key")
    return d


def make_genuine(a: Path, work: Path, canary: Path) -> Path:
    """A genuine bundle C (a new launcher), signed by the key the board trusts: what the swap and the
    rename scenarios start from."""
    return changed_bundle(a, work / "genuine" / "qemu-arm64", "c")


def make_old(a: Path, work: Path, canary: Path) -> Path:
    d = _copy(a, work, "old")
    _launcher_payload(d, canary)          # a hole that was fixed later, say
    _rehash(d, built_at="2001-01-01T00:00:00Z")
    signing.sign_bundle(d)                # validly signed, by the trusted key, long ago
    return d


def make_unsigned(a: Path, work: Path, canary: Path) -> Path:
    d = make_rehashed(a, work / "unsigned", canary)
    (d / bundle.SIGNATURE_NAME).unlink()
    return d


SCENARIOS = [
    Scenario("profile-wrapper", "profile's exec_wrapper runs a payload, manifest re-hashed",
             "signature does not verify", make_wrapper),
    Scenario("profile-python", "launcher's Python replaced by a payload script, manifest re-hashed",
             "signature does not verify", make_python),
    Scenario("profile-sysroot", "manifest's sysroot moved to a directory holding a payload python3.11",
             "signature does not verify", make_sysroot),
    Scenario("wheel-swapped", "board wheel swapped for one whose __main__ runs a payload, re-hashed",
             "signature does not verify", make_wheel),
    Scenario("file-added", "an unlisted launcher/sitecustomize.py added", "is not listed in the manifest",
             make_added),
    Scenario("symlink", "launcher/bmoe-edge-job.sh replaced by a symlink to a payload", "is a symlink",
             make_symlink),
    Scenario("manifest-rehashed", "launcher edited, manifest re-hashed, the old signature kept",
             "signature does not verify", make_rehashed),
    Scenario("manifest-swapped", "genuine signed bundle read, then its manifest and launcher swapped on disk "
             "for forged ones before the upload", "on the board has sha256", make_genuine, run="swap"),
    Scenario("other-key", "forged bundle signed by a key the board does not trust", "signature does not verify",
             make_other_key),
    Scenario("id-mismatch", "genuine signed manifest uploaded as another bundle id (its release directory)",
             "the signed manifest is bundle", make_genuine, run="rename"),
    Scenario("replay-old", "an old bundle, validly signed, replayed over the newer current release",
             "refusing an older bundle over a newer one", make_old),
    Scenario("allow-unsigned-forged", "forged re-hashed bundle deployed with --allow-unsigned",
             "signature does not verify", make_rehashed, run="allow-unsigned"),
    Scenario("unsigned", "forged bundle with its signature removed", "is not signed", make_unsigned),
]
# The default suite's sample (~12 s): the one that ran its payload before issue 27 (the probe), and the
# board-side bundle_id check (a refusal on the board, after an upload). `--allow-unsigned` on a forged
# bundle has a cheaper test of its own (tests/test_fleet_holes.py).
SAMPLE = ("profile-wrapper", "id-mismatch")


@pytest.fixture(scope="module")
def tamper_board(tmp_path_factory: pytest.TempPathFactory, qemu_bundle: Path, board: emulated_board.EmulatedBoard):
    """One emulated board with the session's bundle A current, trusting this machine's build key. A is
    deployed there once (~45 s: its 49 MiB upload and install under qemu), unless the session's main
    board already has A installed (test_deploy.py's deploy): then that release is copied in, as it was
    verified there, and `allowed_signers` written as a first deploy provisions it."""
    lab_dir = tmp_path_factory.mktemp("tamper-lab")
    b = emulated_board.start(lab_dir, "tamper")
    inst = b.dir / "install"
    a_id = bundle.load_manifest(qemu_bundle).bundle_id
    installed = board.install_dir / "releases" / a_id
    if (installed / board_state.STAMP).is_file() and _release_ok_at(installed, qemu_bundle):
        (inst / "releases").mkdir(parents=True)
        shutil.copytree(installed, inst / "releases" / a_id, symlinks=True)
        (inst / "current").symlink_to(f"releases/{a_id}")
        (inst / "allowed_signers").write_text(signing.allowed_signers_line(signing.public_key()) + "\n")
    else:
        [r] = deploy.deploy(qemu_bundle, [fleet_targets.parse_target(b.target)], ssh_config=b.ssh_config,
                            install_dir=str(inst), log=lambda _m: None, health=False)
        assert r.ok, r.error
    yield b, inst
    emulated_board.stop(lab_dir, "tamper")


def _release_ok_at(rel: Path, a: Path) -> bool:
    return (rel / bundle.MANIFEST_NAME).read_bytes() == (a / bundle.MANIFEST_NAME).read_bytes() \
        and (rel / "site" / "bmoe_edge" / "__init__.py").is_file()


def _tampered_id(d: Path) -> str | None:
    try:
        return bundle.load_manifest(d).bundle_id
    except Exception:
        return None


def _deploy(s: Scenario, b: emulated_board.EmulatedBoard, inst: Path, d: Path, work: Path, canary: Path):
    target = fleet_targets.parse_target(b.target)
    common = dict(ssh_config=b.ssh_config, install_dir=str(inst), log=lambda _m: None)
    if s.run == "allow-unsigned":
        return deploy.deploy(d, [target], trust=TrustOptions(allow_unsigned=True), **common)[0]
    if s.run == "swap":
        def swap(_install_dir: str) -> None:     # after the bundle was read: its files change under it
            _launcher_payload(d, canary)
            _rehash(d)

        return deploy.deploy(d, [target], hooks={"locked": swap}, **common)[0]
    if s.run == "rename":
        loaded = load_bundle(d)
        fake = dataclasses.replace(loaded, manifest=dataclasses.replace(loaded.manifest,
                                                                        bundle_id="qemu-arm64-0.1.0-0123456789ab"))
        options = remote.SshOptions(ssh_config=b.ssh_config)
        try:
            return deploy.deploy_host(fake, target, options=options, install_dir=str(inst), log=lambda _m: None)
        except Exception as exc:    # deploy_host raises; deploy() would make it the host's row
            return type("Failed", (), {"ok": False, "error": str(exc)})()
    return deploy.deploy(d, [target], **common)[0]


def _run(s: Scenario, board_and_inst, a: Path, tmp_path: Path) -> dict[str, object]:
    b, inst = board_and_inst
    a_id = bundle.load_manifest(a).bundle_id
    canary = tmp_path / f"canary-{s.name}"
    work = tmp_path / "work"
    d = s.make(a, work, canary)
    tampered = _tampered_id(d)
    started = time.monotonic()
    r = _deploy(s, b, inst, d, work, canary)
    seconds = time.monotonic() - started
    assert not r.ok, f"{s.name}: the tampered bundle was deployed"
    error = str(r.error)
    assert s.refused in error, (s.name, error)
    assert "\n" not in error.strip() and "Traceback" not in error
    assert not canary.exists(), f"{s.name}: the payload ran on the board"
    assert _release_ok(inst, a) == a_id
    for rid in {tampered, "qemu-arm64-0.1.0-0123456789ab"} - {None, a_id}:
        assert not (inst / "releases" / str(rid)).exists()
        assert not (inst / "releases" / f".{rid}.partial" / "site").exists(), f"{s.name}: it was installed"
    [status] = releases.status([fleet_targets.parse_target(b.target)],
                               options=remote.SshOptions(ssh_config=b.ssh_config), install_dir=str(inst))
    assert status.ok and status.bundle_id == a_id, status.error
    return {"scenario": s.name, "tampering": s.what, "refused": error.split(": ", 1)[-1][:200],
            "canary": "absent", "current": a_id, "status": "ok", "seconds": round(seconds, 1)}


@pytest.mark.slow
@pytest.mark.emulated
def test_tamper_sample_is_refused_before_anything_runs(tamper_board, qemu_bundle: Path, tmp_path: Path) -> None:
    for s in (s for s in SCENARIOS if s.name in SAMPLE):
        _run(s, tamper_board, qemu_bundle, tmp_path / s.name)


@pytest.mark.slow
@pytest.mark.emulated
@pytest.mark.full_campaign
def test_tamper_campaign_every_scenario_is_refused(tamper_board, qemu_bundle: Path, tmp_path: Path) -> None:
    rows = [_run(s, tamper_board, qemu_bundle, tmp_path / s.name) for s in SCENARIOS]
    out = os.environ.get("BMOE_EDGE_TAMPER_TABLE")
    if out and FULL_CAMPAIGNS:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
        lines = ["| scenario | tampering | refused with | canary | current | status | s |",
                 "| --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['scenario']} | {r['tampering']} | {str(r['refused']).replace('|', '/')} | {r['canary']} | "
                  f"A | {r['status']} | {r['seconds']} |" for r in rows]
        Path(out).write_text("\n".join(lines) + "\n")
