"""The deploy side's holes of issue 44 (item 8), each closed and held shut by a test that failed before.

Cheap parts only: one real sshd board on 127.0.0.1 (the emulated board, no bundle build) and tiny
synthetic bundles made here (a wheel of one file, a launcher, a profile, a manifest; signed by the
tests' build key or another one), deployed through the real deploy code and CLI:

a. a signed bundle without `built_at` is refused, and so is any bundle over a current release without one;
b. rollback verifies the signature of the release it switches back to, where the board trusts keys;
c. a board this checkout has no profile of: the unverified bundle's profile picks neither the SSH user
   nor the install dir;
d. the wheels are unpacked on this machine only after the signature held, and within caps (a zip bomb
   is refused in one line);
e. the RPC tunnel's local port is never free between being chosen and listening.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import io
import json
import os
import platform
import shutil
import socket
import struct
import sys
import threading
import zipfile
from pathlib import Path
from typing import ClassVar

import pytest

from bmoe_edge.boards import bundle, profiles, signing
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import deploy, emulated_board, remote, tunnel
from bmoe_edge.fleet import state as board_state
from bmoe_edge.fleet import targets as fleet_targets
from bmoe_edge.fleet.trust import ALLOWED, TrustOptions

from conftest import run_cli
from test_deploy import _env, assert_one_error

UNKNOWN = "nowhere-board"          # a board this checkout has no profile of
BUILT = "2026-12-01T00:00:00Z"
WHEEL = f"{bundle.WHEELS_DIR}/tiny-0.1-py3-none-any.whl"


@pytest.fixture(scope="module")
def edge_board(tmp_path_factory: pytest.TempPathFactory):
    """One emulated board (its sshd only) for this module."""
    lab_dir = tmp_path_factory.mktemp("deploy-holes-lab")
    b = emulated_board.start(lab_dir, "deploy-holes")
    yield b
    emulated_board.stop(lab_dir, "deploy-holes")


def _zip(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return out.getvalue()


def tiny_bundle(dest: Path, *, ssh: profiles.Ssh | None = None, extra: dict[str, object] | None = None,
                wheel: bytes | None = None, launcher: str = "#!/bin/sh\nexit 1\n", sign: bool = True,
                key: Path | None = None) -> Path:
    """A bundle for UNKNOWN: one wheel, a launcher, the host profile renamed; signed with the tests'
    build key (or `key`) unless `sign` is False. `extra` defaults to a build time. Its id comes from
    its files (dest's name is in the launcher): the manifest's `extra` alone would not change it."""
    host = profiles.load_profile("host")
    profile = dataclasses.replace(host, name=UNKNOWN, ssh=ssh or host.ssh)
    for sub in (bundle.WHEELS_DIR, bundle.LAUNCHER_DIR, bundle.PROFILE_DIR):
        (dest / sub).mkdir(parents=True)
    (dest / WHEEL).write_bytes(wheel if wheel is not None else _zip({"tiny/__init__.py": b"x = 1\n"}))
    (dest / bundle.LAUNCHER_SCRIPT).write_text(f"{launcher}# {dest.name}\n")    # an id of its own
    (dest / bundle.LAUNCHER_SCRIPT).chmod(0o755)
    (dest / bundle.profile_path(UNKNOWN)).write_text(profiles.profile_file_text(profile))
    bundle.write_manifest(dest, board=UNKNOWN, arch=platform.machine(), profile=bundle.profile_path(UNKNOWN),
                          python="3.11", glibc_required="2.17", needed_libs=(),
                          llama=bundle.LlamaPin("v", "s", "c", ()), compilers={}, cmake_flags={},
                          bmoe_edge_version="0.0.1", wheel=WHEEL, dependency_wheels=(),
                          extra={"built_at": BUILT} if extra is None else extra)
    if sign:
        signing.sign_bundle(dest, key)
    return dest


def _install_dir(b: emulated_board.EmulatedBoard, name: str, *, trusted: bool = True) -> Path:
    inst = b.dir / name
    (inst / "releases").mkdir(parents=True)
    if trusted:
        (inst / ALLOWED).write_text(signing.allowed_signers_line(signing.public_key()) + "\n")
    return inst


def _put_release(inst: Path, src: Path, *, current: bool = False) -> str:
    """src as a complete release of the install dir (copied as a deploy leaves it); its id."""
    rid = bundle.load_manifest(src).bundle_id
    shutil.copytree(src, inst / "releases" / rid)
    (inst / "releases" / rid / board_state.STAMP).write_text(json.dumps(
        {"bundle_id": rid, "board": UNKNOWN, "installed_at": "2026-12-01T00:00:00Z"}))
    if current:
        (inst / "current").symlink_to(f"releases/{rid}")
    return rid


def _deploy(b: emulated_board.EmulatedBoard, d: Path, inst: Path | None, *, target: str | None = None,
            trust: TrustOptions | None = None):
    [r] = deploy.deploy(d, [fleet_targets.parse_target(target or b.target)], ssh_config=b.ssh_config,
                        install_dir=str(inst) if inst else None, log=lambda _m: None, trust=trust,
                        host_timeout=300)
    return r


# ---------------------------------------------------------------------------------------------------
# a. build times


def test_a_signed_bundle_without_a_build_time_is_refused(edge_board, tmp_path: Path) -> None:
    inst = _install_dir(edge_board, "inst-no-built-at")
    _put_release(inst, tiny_bundle(tmp_path / "cur", extra={"built_at": BUILT, "v": 1}), current=True)
    old = tiny_bundle(tmp_path / "old", extra={})        # validly signed, no build time: its age unknown
    r = _deploy(edge_board, old, inst)
    assert not r.ok and "records no build time" in r.error and "--allow-downgrade" in r.error, r.error
    old_id = bundle.load_manifest(old).bundle_id
    assert not (inst / "releases" / f".{old_id}.partial").exists(), "refused only after uploading it"
    # unsigned and let in by --allow-unsigned: its age cannot be compared either
    unsigned = tiny_bundle(tmp_path / "unsigned", extra={}, sign=False)
    r = _deploy(edge_board, unsigned, inst, trust=TrustOptions(allow_unsigned=True))
    assert not r.ok and "records no build time" in r.error and "cannot tell whether" in r.error, r.error


def test_a_current_release_without_a_build_time_lets_nothing_in_silently(edge_board, tmp_path: Path) -> None:
    inst = _install_dir(edge_board, "inst-current-no-built-at")
    cur = _put_release(inst, tiny_bundle(tmp_path / "cur", extra={"v": 1}), current=True)
    new = tiny_bundle(tmp_path / "new")
    new_id = bundle.load_manifest(new).bundle_id
    result = run_cli("deploy", "--bundle", str(new), "--host", edge_board.target, "--install-dir", str(inst),
                     env=_env(edge_board.lab), timeout=300)
    assert_one_error(result, f"the current release {cur} records no build time", "--allow-downgrade")
    assert not (inst / "releases" / f".{new_id}.partial").exists()
    # said out loud, the operator takes it: the check lets it through (it goes on to upload it)
    _deploy(edge_board, new, inst, trust=TrustOptions(allow_downgrade=True))
    assert (inst / "releases" / f".{new_id}.partial" / bundle.MANIFEST_NAME).is_file() or \
        (inst / "releases" / new_id).is_dir()


# ---------------------------------------------------------------------------------------------------
# b. rollback checks the signature of the release it goes back to


def test_rollback_verifies_the_signature_of_the_release_it_switches_to(edge_board, tmp_path: Path) -> None:
    inst = _install_dir(edge_board, "inst-rollback")
    canary = tmp_path / "canary"
    a_id = _put_release(inst, tiny_bundle(tmp_path / "a"), current=True)
    runs = f"#!/bin/sh\ntouch '{canary}'\necho 'machine: {platform.machine()}'\n"
    other = tmp_path / "other-key" / "key"
    forged = tiny_bundle(tmp_path / "forged", launcher=runs, key=other)      # a key the board does not trust
    f_id = _put_release(inst, forged)
    (inst / board_state.STATE).write_text(json.dumps({"bundle_id": a_id, "previous": f_id}))

    def rollback():
        return run_cli("rollback", "--host", edge_board.target, "--install-dir", str(inst),
                       env=_env(edge_board.lab), timeout=300)

    assert_one_error(rollback(), f"{f_id}", "signature does not verify", "nothing switched")
    assert os.readlink(inst / "current") == f"releases/{a_id}" and not canary.exists()
    (inst / "releases" / f_id / signing.SIGNATURE_NAME).unlink()             # no signature at all
    assert_one_error(rollback(), "signature does not verify", "nothing switched")
    assert os.readlink(inst / "current") == f"releases/{a_id}" and not canary.exists()
    # signed by the key the board trusts: the rollback goes through
    signing.sign_bundle(inst / "releases" / f_id)
    result = rollback()
    assert result.returncode == 0, result.stderr
    assert os.readlink(inst / "current") == f"releases/{f_id}" and canary.exists()


# ---------------------------------------------------------------------------------------------------
# c. the login and the install dir of a board this checkout has no profile of


def test_an_unverified_bundle_profile_picks_no_login_and_no_install_dir(edge_board, tmp_path: Path) -> None:
    chosen = edge_board.dir / "chosen-by-the-bundle"
    ssh = profiles.Ssh(user="mallory", install_dir=str(chosen), host=None, port=None)
    d = tiny_bundle(tmp_path / "b", ssh=ssh, sign=False)
    inst = _install_dir(edge_board, "inst-login")
    # no user on the command line: the login is this machine's user (or the ssh config's), not mallory
    r = _deploy(edge_board, d, inst, target=f"127.0.0.1:{edge_board.port}")
    assert not r.ok and "mallory" not in r.error and r.error.startswith(f"{getpass.getuser()}@"), r.error
    assert "is not signed" in r.error, r.error
    # no install dir given: refused up front, the bundle's is never touched
    r = _deploy(edge_board, d, None)
    assert not r.ok and "--install-dir" in r.error and "no profile of board" in r.error, r.error
    assert not chosen.exists()
    # signed by this machine's key: its profile is the builder's word, and picks the install dir
    signed = tiny_bundle(tmp_path / "signed", ssh=dataclasses.replace(ssh, user=edge_board.user))
    _deploy(edge_board, signed, None)
    assert (chosen / "releases").is_dir()


# ---------------------------------------------------------------------------------------------------
# d. the wheels: unpacked after the signature, and within caps


def _bomb(size: int) -> bytes:
    """One member of `size` zero bytes, deflated (~1000:1)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf, zf.open("zeros.bin", "w") as f:
        chunk = bytes(1 << 20)
        for _ in range(size >> 20):
            f.write(chunk)
    return out.getvalue()


def _lying(declared: int) -> bytes:
    """A stored member of 10 bytes whose central directory says it unpacks to `declared` bytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("a.txt", b"0123456789")
    data = bytearray(out.getvalue())
    at = data.index(b"PK\x01\x02")
    data[at + 24:at + 28] = struct.pack("<I", declared)
    return bytes(data)


def test_unpacking_wheels_is_bounded(tmp_path: Path) -> None:
    def digest_of(wheel: bytes) -> None:
        d = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
        (d / bundle.WHEELS_DIR).mkdir(parents=True)
        (d / WHEEL).write_bytes(wheel)
        bundle.site_digest(d, [WHEEL])

    digest_of(_zip({"tiny/__init__.py": b"x = 1\n" * 100}))      # a wheel as a build makes one
    with pytest.raises(BmoeError, match=r"compression ratio .* refusing"):
        digest_of(_bomb(64 << 20))
    with pytest.raises(BmoeError, match=r"unpack to more than .* refusing"):
        digest_of(_lying(bundle.MAX_UNPACKED_BYTES + 1))
    with pytest.raises(BmoeError, match=r"more than .* members.* refusing"):
        digest_of(_zip({f"m{i}": b"" for i in range(bundle.MAX_WHEEL_MEMBERS + 1)}))
    with pytest.raises(BmoeError, match=r"not a zip"):
        digest_of(b"not a zip at all")


def test_wheels_are_unpacked_here_only_after_the_signature_held(edge_board, tmp_path: Path) -> None:
    inst = _install_dir(edge_board, "inst-bomb")
    other = tmp_path / "other-key" / "key"
    # no site_sha256 in the manifest (the deploy computes it from the wheels), a wheel no zip reader
    # takes, signed by a key the board does not trust: refused for the signature, the wheel never opened
    d = tiny_bundle(tmp_path / "garbage", wheel=b"PK\x03\x04 not really a zip", key=other)
    r = _deploy(edge_board, d, inst)
    assert not r.ok and "signature does not verify" in r.error, r.error
    # unsigned, let in by --allow-unsigned: a zip bomb is still refused in one line, before any upload
    bomb = tiny_bundle(tmp_path / "bomb", wheel=_bomb(64 << 20), sign=False)
    result = run_cli("deploy", "--bundle", str(bomb), "--host", edge_board.target, "--install-dir", str(inst),
                     "--allow-unsigned", env=_env(edge_board.lab), timeout=300)
    assert_one_error(result, "compression ratio", "refusing")
    bomb_id = bundle.load_manifest(bomb).bundle_id
    assert not (inst / "releases" / f".{bomb_id}.partial").exists()


# ---------------------------------------------------------------------------------------------------
# e. the tunnel's local port


class Squatter:
    """Another local process at the worst moment, through an audit hook (the hook only gives the timing;
    the socket is real): the instant this process binds a port of 127.0.0.1 it chose before — a nonzero
    port: chosen by binding and closing, then bound again — the squatter is already listening on it."""

    armed = False
    busy = False
    sockets: ClassVar[list[socket.socket]] = []

    @classmethod
    def hook(cls, event: str, args: tuple) -> None:
        if event != "socket.bind" or not cls.armed or cls.busy:
            return
        address = args[1]
        if not (isinstance(address, tuple) and address[:1] == ("127.0.0.1",) and address[1] != 0):
            return
        cls.busy = True        # its own bind comes through the hook too
        try:
            s = socket.socket()
            s.bind(address)
            s.listen(8)
            cls.sockets.append(s)
        except OSError:
            pass
        finally:
            cls.busy = False


sys.addaudithook(Squatter.hook)     # for the process's life (hooks cannot be removed): idle unless armed


def test_the_tunnels_local_port_is_never_free_for_another_process(edge_board) -> None:
    worker = socket.create_server(("127.0.0.1", 0))      # the rpc-worker on the board's loopback
    worker.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = worker.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"worker")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    target = fleet_targets.parse_target(edge_board.target)
    options = remote.SshOptions(ssh_config=edge_board.ssh_config)
    got, failure = b"", None
    Squatter.sockets, Squatter.armed = [], True
    try:
        with tunnel.rpc_tunnels([target], options, worker_port=worker.getsockname()[1]) as [endpoint]:
            host, port = endpoint.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=5) as c, contextlib.suppress(TimeoutError):
                got = c.recv(64)       # from the worker through the tunnel, or nothing from a squatter
    except Exception as exc:       # what a tunnel that lost its port raises as it closes
        failure = exc
    finally:
        Squatter.armed = False
        stop.set()
        server.join(timeout=5)
        worker.close()
    squatted = len(Squatter.sockets)
    for s in Squatter.sockets:
        s.close()
    assert got == b"worker" and failure is None and not squatted, (got, failure, squatted)
