"""The fleet's smaller holes of issue 27, each closed and held shut by a test that failed before.

Fast (no bundle; a real sshd on 127.0.0.1 where a board is needed, real sh for the board scripts):
push-model takes the lock of its destination; an install dir with a `=` runs the release, not PATH;
names with a trailing newline; tab-separated known_hosts markers; the wheel lock refuses a wheel it
does not name; the board lock lets a silent client go and a stale lock directory is taken by one
waiter; rollback skips a release whose gates failed; a health check is retried before a release is
marked failed; the service units' hardening and their start limit; and, from issue 26, a service
beyond loopback without a key refused up front, serve's options reaching the unit.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import (
    channel,
    commands,
    emulated_board,
    host_keys,
    install,
    lock,
    models,
    onboard,
    releases,
    remote,
    services,
)
from bmoe_edge.fleet import state as board_state
from bmoe_edge.fleet import targets as fleet_targets
from bmoe_edge.fleet.scripts import LOCK

from conftest import assert_clean_error, campaign_size, run_cli
from test_deploy import _unit_fields


@pytest.fixture(scope="module")
def holes_board(tmp_path_factory: pytest.TempPathFactory):
    """One emulated board (its sshd only: no bundle) for this module."""
    lab_dir = tmp_path_factory.mktemp("holes-lab")
    b = emulated_board.start(lab_dir, "holes")
    yield b
    emulated_board.stop(lab_dir, "holes")


def _connect(b: emulated_board.EmulatedBoard) -> commands.Board:
    return commands.Board(fleet_targets.parse_target(b.target), remote.SshOptions(ssh_config=b.ssh_config))


# ---------------------------------------------------------------------------------------------------
# Item 3: push-model takes a lock.


def test_push_model_waits_for_the_lock_of_its_destination(holes_board, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(os.urandom(4096))
    dest_dir = holes_board.dir / "models-locked"
    target = fleet_targets.parse_target(holes_board.target)
    options = remote.SshOptions(ssh_config=holes_board.ssh_config)
    with _connect(holes_board) as other, lock.board_lock(other, str(dest_dir), action="another push-model"):
        [r] = models.push_model(model, [target], options=options, to=f"{dest_dir}/", log=lambda _m: None,
                                lock_timeout=1)
        assert not r.ok and "is locked by another run (another push-model" in r.error, r.error
        assert not (dest_dir / "m.gguf").exists() and not (dest_dir / ("m.gguf" + models.PART)).exists()
    [r] = models.push_model(model, [target], options=options, to=f"{dest_dir}/", log=lambda _m: None)
    assert r.ok, r.error
    assert (dest_dir / "m.gguf").read_bytes() == model.read_bytes()


# ---------------------------------------------------------------------------------------------------
# Item 4: `=` in an install dir, a newline in a name.


def test_a_release_under_a_path_with_an_equals_sign_runs_its_own_launcher(holes_board, tmp_path: Path) -> None:
    """`env K=V /opt/a=b/…/bmoe-edge.sh gates` made env take the launcher for one more variable and run
    `gates` from PATH; the release's own launcher must run."""
    rel = holes_board.dir / "inst=1" / "releases" / "r1"
    (rel / "launcher").mkdir(parents=True)
    launcher = rel / "launcher" / "bmoe-edge.sh"
    launcher.write_text('#!/bin/sh\nprintf "release launcher: %s release=%s\\n" "$*" "$BMOE_EDGE_RELEASE"\n')
    launcher.chmod(0o755)
    with _connect(holes_board) as b:
        result = onboard.run_release(b, str(rel), ["gates", "--quick"], what="gates", timeout=60)
    assert result.exited == 0, result.stderr
    assert result.stdout.strip() == f"release launcher: gates --quick release={rel}"


def test_names_with_a_trailing_newline_are_not_plain() -> None:
    assert fleet_targets.check_name("rpi5-0.1.0-abc", "bundle id") == "rpi5-0.1.0-abc"
    for bad in ("rpi5\n", "rpi5-0.1.0-abc\n", "a\nb"):
        with pytest.raises(BmoeError, match="is not a plain name"):
            fleet_targets.check_name(bad, "bundle id")


# ---------------------------------------------------------------------------------------------------
# Item 9 (the host-key half): markers split by a tab.


@pytest.mark.parametrize("line", ["@revoked\t* ssh-ed25519 AAAAC3Nz", "@cert-authority\t*.lan ssh-ed25519 AAAA",
                                  "  @REVOKED  * ssh-ed25519 AAAAC3Nz"])
def test_known_hosts_markers_after_any_whitespace_are_refused(tmp_path: Path, line: str) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"{line}\n")
    with pytest.raises(BmoeError, match="lines are not supported"):
        host_keys.check_known_hosts(known)


# ---------------------------------------------------------------------------------------------------
# Item 7: the wheel lock trusts no new wheel on first use.


def test_the_wheel_lock_refuses_a_wheel_it_does_not_name(tmp_path: Path) -> None:
    from bmoe_edge.boards import build

    lock_file = tmp_path / build.WHEEL_LOCK
    old, new = tmp_path / "typer-0.12.3-py3-none-any.whl", tmp_path / "typer-0.13.0-py3-none-any.whl"
    old.write_bytes(b"old")
    new.write_bytes(b"a new version the index now serves")
    build.check_wheel_lock(lock_file, [old], update=True)
    text = lock_file.read_text()
    with pytest.raises(BmoeError, match=r"typer-0\.13\.0-py3-none-any\.whl is not in board-wheels\.lock.*"
                                        r"--update-lock"):
        build.check_wheel_lock(lock_file, [new])
    assert lock_file.read_text() == text
    build.check_wheel_lock(lock_file, [new], lambda _m: None, update=True)
    assert "typer-0.13.0-py3-none-any.whl" in lock_file.read_text()
    # the checkout's lock names every wheel the boards' builds take (nothing is pinned on first use)
    assert "pyyaml-6.0.4-cp311-cp311-manylinux2014_x86_64" in (build.PROJECT_ROOT / build.WHEEL_LOCK).read_text()


# ---------------------------------------------------------------------------------------------------
# Item 8: the board lock (sh/lock.sh, run by this machine's sh as a board runs it).


def _lock_process(directory: Path, mode: str, *, wait: int = 20, silence: int = 60) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["sh", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdin is not None
    p.stdin.write(channel.frame(LOCK, [str(directory), str(wait), "test holder", mode, str(silence)],
                                keep_stdin=True).encode())
    p.stdin.flush()
    return p


@pytest.mark.parametrize("mode", ["auto", pytest.param("dir", marks=pytest.mark.full_campaign)])
def test_a_lock_holder_that_goes_silent_is_let_go(tmp_path: Path, mode: str) -> None:
    """A client that vanished without a FIN keeps its channel's stdin open but sends nothing: after
    `silence` s without a heartbeat line the board lets the lock go; heartbeats keep it."""
    beating = _lock_process(tmp_path, mode, silence=2)
    assert beating.stdout is not None and beating.stdin is not None
    assert beating.stdout.readline() == b"locked\n"
    for _ in range(8):
        time.sleep(0.25)
        beating.stdin.write(b"\n")
        beating.stdin.flush()
    assert beating.poll() is None, "a holder that sends heartbeats keeps the lock"
    beating.stdin.close()
    assert beating.wait(timeout=10) == 0
    silent = _lock_process(tmp_path, mode, silence=2)
    assert silent.stdout is not None and silent.stdout.readline() == b"locked\n"
    started = time.monotonic()
    silent.wait(timeout=15)
    assert time.monotonic() - started < 8
    nxt = _lock_process(tmp_path, mode, wait=5)
    assert nxt.stdout is not None and nxt.stdout.readline() == b"locked\n"
    nxt.kill()
    nxt.wait()
    silent.stdin.close()  # type: ignore[union-attr]


def test_a_stale_lock_directory_is_taken_over_by_one_waiter_only(tmp_path: Path) -> None:
    """Waiters that all find a dead holder's lock directory: exactly one takes it (before, each removed
    the directory the one before had just made, and two held the lock at once)."""
    for trial in range(campaign_size(sample=1, full=20)):
        d = tmp_path / f"t{trial}"
        (d / ".lock.d").mkdir(parents=True)
        (d / ".lock.d" / "pid").write_text("999999\n")     # above pid_max on a default kernel: dead
        waiters = [_lock_process(d, "dir", wait=6) for _ in range(4)]
        time.sleep(2.0)
        holders = 0
        for p in waiters:
            assert p.stdout is not None
            fcntl.fcntl(p.stdout, fcntl.F_SETFL, fcntl.fcntl(p.stdout, fcntl.F_GETFL) | os.O_NONBLOCK)
            holders += b"locked" in (p.stdout.read() or b"")
            p.kill()
            p.wait()
        assert holders == 1, f"trial {trial}: {holders} waiters hold the lock at once"


# ---------------------------------------------------------------------------------------------------
# Item 6: rollback's choice, the health check's retries.


def _releases(current: str, *ids: str, failed: set[str] | None = None) -> board_state.Releases:
    stamps = {rid: {"installed_at": f"2026-12-01T00:0{i}:00Z"} for i, rid in enumerate(ids)}
    return board_state.Releases(None, current, f"releases/{current}", stamps, [], failed or set())


def test_rollback_never_picks_a_release_whose_gates_failed() -> None:
    layout = board_state.Layout("/opt/b")
    board = type("Labelled", (), {"label": "pi@pi5:22"})()
    rel = _releases("c", "a", "b", "c")
    state = {"bundle_id": "c", "previous": "b",
             "releases": {"b": {"gates": {"passed": 3, "failed": 1}}, "a": {"gates": {"passed": 4, "failed": 0}}}}
    assert releases._previous(board, layout, rel, state) == "a"       # type: ignore[arg-type]
    state["releases"]["a"]["gates"]["failed"] = 2
    with pytest.raises(BmoeError, match=r"no previous release .* marked failed: a, b"):
        releases._previous(board, layout, rel, state)                  # type: ignore[arg-type]


def test_a_transient_health_check_failure_is_retried() -> None:
    calls: list[float] = []

    def flaky() -> None:
        calls.append(time.monotonic())
        if len(calls) < 2:
            raise BmoeError("pi@pi5:22: health check of current (--version): timed out after 300 s")

    install.retried(flaky, attempts=3, pause=0.01)
    assert len(calls) == 2
    calls.clear()

    def broken() -> None:
        calls.append(time.monotonic())
        raise BmoeError("pi@pi5:22: the installed release does not run on the board")

    with pytest.raises(BmoeError, match="does not run"):
        install.retried(broken, attempts=3, pause=0.01)
    assert len(calls) == 3 and install.HEALTH_ATTEMPTS >= 2


# ---------------------------------------------------------------------------------------------------
# Item 5: the service units.

HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "tmpfs", "PrivateTmp": "yes",
    "PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes", "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    "RestrictNamespaces": "yes", "SystemCallArchitectures": "native", "CapabilityBoundingSet": "",
    "TasksMax": "256", "LimitNOFILE": "4096", "StartLimitIntervalSec": "600", "StartLimitBurst": "5",
    "RestartSec": "5", "Restart": "on-failure",
}


@pytest.mark.parametrize("kind", ["serve", "rpc-worker"])
def test_service_units_are_hardened_and_a_crash_loop_stops(tmp_path: Path, kind: str) -> None:
    model = "/home/pi/models/m.gguf" if kind == "serve" else None
    spec = services.spec_for(kind, model=model, bind="127.0.0.1", port=None, api_key=None)
    layout = board_state.Layout("/home/pi/bmoe-edge")
    text = services.render_unit(spec, layout, "pi", "rpi5", ram_mb=8192)
    fields = _unit_fields(text)
    for key, want in HARDENING.items():
        assert fields.get(key) == want, (key, fields.get(key))
    assert "SystemCallFilter=@system-service" in text and "SystemCallFilter=~@privileged" in text
    # ~/.ssh is hidden (ProtectHome), the release and the model come back read-only, the service's dir rw
    assert fields["BindReadOnlyPaths"] == '"/home/pi/bmoe-edge"' + (f' "{model}"' if model else "")
    assert fields["BindPaths"] == f'"/home/pi/bmoe-edge/services/{kind}"'
    # a crash loop reaches the start limit: its restarts come faster than the limit's interval
    assert int(fields["StartLimitBurst"]) == services.START_LIMIT_BURST
    assert int(fields["StartLimitIntervalSec"]) == services.START_LIMIT_INTERVAL
    assert services.START_LIMIT_BURST * int(fields["RestartSec"]) < services.START_LIMIT_INTERVAL
    if shutil.which("systemd-analyze"):
        unit = tmp_path / services.unit_name(spec.kind)
        unit.write_text(text)
        found = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True,
                               text=True)
        exposure = found.stdout.strip().splitlines()[-1] if found.stdout.strip() else found.stderr
        assert "Overall exposure level" in exposure and float(exposure.split(":")[1].split()[0]) < 2.5, exposure
        for directive in ("PrivateDevices=", "SystemCallFilter=~@privileged", "RestrictAddressFamilies=~AF_PACKET",
                          "ProtectKernelTunables=", "ProtectKernelModules=", "CapabilityBoundingSet=~CAP_SYS_ADMIN"):
            assert any(ln.startswith("✓ " + directive) for ln in found.stdout.splitlines()), directive
        # tmpfs, not `yes`: the release and the model under /home are bound back into the empty homes
        assert any("ProtectHome=" in ln and "fake empty home" in ln for ln in found.stdout.splitlines())


def test_status_says_when_the_start_limit_stopped_a_crash_loop() -> None:
    shown = services.state_text({"ActiveState": "failed", "SubState": "failed", "NRestarts": "4",
                                 "Result": "start-limit-hit"}, "bmoe-edge-serve.service")
    assert shown.startswith("failed (failed), 4 restarts; stopped by systemd's start limit: it crashed 5 times")
    assert "journalctl -u bmoe-edge-serve.service" in shown and "reset-failed" in shown
    assert services.state_text({"ActiveState": "active", "SubState": "running", "NRestarts": "0",
                                "Result": "success"}, "u") == "active (running)"



# ---------------------------------------------------------------------------------------------------
# From issue 26: `deploy --service serve` beyond loopback needs a key; serve's options reach the unit.


def test_a_service_beyond_loopback_without_an_api_key_is_refused_up_front(tmp_path: Path) -> None:
    result = run_cli("deploy", "--board", "rpi5", "--dist", str(tmp_path), "--host", "pi@192.0.2.1",
                     "--service", "serve", "-m", "/home/pi/m.gguf", "--bind", "0.0.0.0", timeout=60)
    assert_clean_error(result, "--bind 0.0.0.0", "needs an API key", "--api-key-file")
    with pytest.raises(BmoeError, match="needs an API key"):
        services.spec_for("serve", model="/m.gguf", bind="::", port=None, api_key=None)
    assert services.spec_for("serve", model="/m.gguf", bind="0.0.0.0", port=None, api_key="k").bind == "0.0.0.0"


def test_serve_options_reach_the_unit() -> None:
    spec = services.spec_for("serve", model="/m/m.gguf", bind="0.0.0.0", port=8181, api_key="k",
                             serve={"allowed_host": ("pi5.lan", "pi5"), "cors_origin": ("https://app.example",),
                                    "max_connections": 16})
    fields = _unit_fields(services.render_unit(spec, board_state.Layout("/opt/b"), "pi", "rpi5", ram_mb=8192))
    argv = shlex.split(fields["ExecStart"].replace("%%", "%").replace("$$", "$"))
    assert argv[argv.index("--api-key-file") + 1] == "/opt/b/services/serve/api-key"
    assert argv[-8:] == ["--allowed-host", "pi5.lan", "--allowed-host", "pi5", "--cors-origin",
                         "https://app.example", "--max-connections", "16"]
    with pytest.raises(BmoeError, match="takes no --max-connections"):
        services.spec_for("rpc-worker", model=None, bind="127.0.0.1", port=None, api_key=None,
                          serve={"max_connections": 3})


# ---------------------------------------------------------------------------------------------------
# Item 9 (the trust half): --allow-unsigned lets an unsigned bundle in, never a forged signed one.


def test_allow_unsigned_still_checks_a_signed_bundle(holes_board, tmp_path: Path) -> None:
    from bmoe_edge.boards import signing
    from bmoe_edge.fleet.trust import TrustOptions, check_trust
    from bmoe_edge.fleet.upload import LocalBundle

    from test_deploy import _manifest_like

    signed = tmp_path / "b"
    signed.mkdir()
    (signed / "manifest.json").write_bytes(b'{"the": "genuine manifest"}\n')
    sig = signing.sign_bundle(signed).read_bytes()
    install_dir = holes_board.dir / "trusting"
    install_dir.mkdir()
    (install_dir / "allowed_signers").write_text(signing.allowed_signers_line(signing.public_key()) + "\n")
    layout = board_state.Layout(str(install_dir))

    def local(manifest: bytes, signature: bytes | None) -> LocalBundle:
        return LocalBundle(signed, _manifest_like(), "", None, None, manifest_bytes=manifest,  # type: ignore[arg-type]
                           signature_bytes=signature)

    allow = TrustOptions(allow_unsigned=True)
    with _connect(holes_board) as b:
        assert check_trust(b, layout, local(b'{"the": "genuine manifest"}\n', sig), allow, lambda _m: None)
        assert not check_trust(b, layout, local(b'{"an": "unsigned one"}\n', None), allow, lambda _m: None)
        with pytest.raises(BmoeError, match=r"signature does not verify .*refusing it"):
            check_trust(b, layout, local(b'{"a": "forged one"}\n', sig), allow, lambda _m: None)
