"""A deploy you can trust on a fleet (issue 14), with real parts: real sshds on 127.0.0.1 (the emulated
board), a real bundle, real processes killed and frozen.

Fast (no bundle): arguments of any size and content reach the board unchanged without the login shell,
files travel without SFTP, the board lock (flock and lock directory) waits, times out and is released
when its holder dies, a frozen board is cut off by the keepalive, host deadlines and --fail-fast,
ProxyJump hops checked strictly, known_hosts markers refused.
Slow: two deploys at once, a health check that fails after the switch, a tampered site/, a fleet with a
killed and a frozen board, a board without SFTP, deploys killed at random points.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bmoe_edge.boards import bundle, signing
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import commands, deploy, emulated_board, lock, parallel, remote, report, systemd
from bmoe_edge.fleet import state as board_state
from bmoe_edge.fleet import targets as fleet_targets

import test_deploy as shared
from conftest import campaign_size, run_cli
from test_deploy import _env, _host, _release_ok, assert_one_error, changed_bundle

# What these tests prove (locks, trust, rollback, kill points, fleets, push-model) is the fleet's logic,
# the same for every board: they deploy the session's host bundle (test_deploy's host_a, and host_b with
# one changed file), which the board runs natively; the emulated aarch64 board has its own deploy tests.
host_a, host_b = shared.host_a, shared.host_b


@pytest.fixture(scope="module")
def bundle_a(host_a: Path) -> Path:
    return host_a


@pytest.fixture(scope="module")
def bundle_b(host_b: Path) -> Path:
    return host_b


HOSTILE = "a\"b $(touch /tmp/pwned-bmoe) `id` \n c 'q' ; \\ end \\\\n %s %% ${HOME} \t\r\n\x01 é ✓ "


def _descendants(pid: int) -> list[int]:
    """pid and every process below it (/proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _signal_board(b: emulated_board.EmulatedBoard, sig: int) -> None:
    """The board's sshd and everything it runs (sessions, their commands): a power cut (SIGKILL), a hung
    board (SIGSTOP), or back to life (SIGCONT)."""
    for pid in _descendants(b.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@pytest.fixture()
def boards(tmp_path: Path):
    lab_dir = tmp_path / "lab"
    started: list[emulated_board.EmulatedBoard] = []

    def start(name: str, **kwargs) -> emulated_board.EmulatedBoard:
        b = emulated_board.start(lab_dir, name, **kwargs)
        started.append(b)
        return b

    yield lab_dir, start
    for b in started:
        _signal_board(b, signal.SIGCONT)
        emulated_board.stop(lab_dir, b.name)


def _board(b: emulated_board.EmulatedBoard, **options) -> commands.Board:
    return commands.Board(fleet_targets.parse_target(b.target), remote.SshOptions(ssh_config=b.ssh_config, **options))


# ---------------------------------------------------------------------------------------------------
# Fast: no bundle.


def test_arguments_and_files_of_any_size_and_content_arrive_unchanged_without_sftp(boards) -> None:
    _lab, start = boards
    b = start("nosftp", sftp=False)
    prompt = HOSTILE * 4000                          # ~200 KB: past the kernel's 128 KiB per-argument limit
    assert len(prompt.encode()) > 200_000
    with _board(b) as board:
        out = board.sh('printf %s "$1" | sha256sum; printf "%s\\n" "$#"', prompt, "x", what="echo").stdout.split()
        assert out[0] == hashlib.sha256(prompt.encode()).hexdigest() and out[-1] == "2"
        data = bytes(range(256)) * 1000 + prompt.encode()
        path = str(b.dir / "f $(x) 'q'.bin")
        board.write_bytes(path, data, 0o600)
        assert Path(path).read_bytes() == data and (Path(path).stat().st_mode & 0o777) == 0o600
        assert board.read_bytes(path) == data and board.read_bytes(path + ".missing") is None
        local = b.dir / "local" / "put.bin"
        local.parent.mkdir()
        local.write_bytes(data[:100_000])
        local.chmod(0o755)
        board.put_files(local.parent, ["put.bin"], str(b.dir))
        assert (b.dir / "put.bin").read_bytes() == data[:100_000] and os.access(b.dir / "put.bin", os.X_OK)
        # the request files (the framed scripts that carried data) delete themselves
        assert not any((b.home / ".cache" / "bmoe-edge" / "req").iterdir())
    assert not Path("/tmp/pwned-bmoe").exists()


@pytest.mark.parametrize("mode", ["auto", "dir"])
def test_board_lock_waits_times_out_and_is_released_when_its_holder_dies(boards, tmp_path: Path, mode: str) -> None:
    _lab, start = boards
    b = start(f"lock-{mode}")
    inst = str(tmp_path / "inst dir $(x)")
    said: list[str] = []
    with _board(b) as first, _board(b) as second:
        with lock.board_lock(first, inst, action="deploy of A", mode=mode):
            t0 = time.monotonic()
            with pytest.raises(BmoeError) as err, lock.board_lock(second, inst, action="deploy of B", wait=2,
                                                                  mode=mode, say=said.append):
                pass
            assert 1.5 < time.monotonic() - t0 < 30
            assert "is locked by another run (deploy of A by " in str(err.value) and "--lock-timeout" in str(err.value)
            assert said and "deploy of A" in said[0]
        # released: taken at once
        with lock.board_lock(second, inst, action="deploy of B", wait=2, mode=mode):
            pass
    # a holder that dies (its connection dropped, nothing released by it) frees the lock
    holder = _board(b).open()
    with _board(b) as waiter:
        ctx = lock.board_lock(holder, inst, action="a killed deploy", mode=mode)
        ctx.__enter__()
        threading.Timer(1.0, holder.abort).start()
        t0 = time.monotonic()
        with lock.board_lock(waiter, inst, action="the re-run", wait=60, mode=mode):
            assert time.monotonic() - t0 < 30
    holder.close()
    if mode == "dir":   # a stale lock directory (its holder's pid is gone, e.g. after a reboot) is taken over
        stale = Path(inst) / ".lock.d"
        stale.mkdir()
        (stale / "pid").write_text("999999999\n")
        with _board(b) as board, lock.board_lock(board, inst, action="after a reboot", wait=0, mode=mode):
            pass


def test_a_frozen_board_is_cut_off_by_the_keepalive(boards) -> None:
    _lab, start = boards
    b = start("frozen")
    board = _board(b, keepalive=1.0, keepalive_count=2).open()
    try:
        threading.Timer(1.5, _signal_board, (b, signal.SIGSTOP)).start()
        t0 = time.monotonic()
        with pytest.raises(BmoeError, match="stopped answering"):
            board.sh("sleep 120", what="a long step", timeout=None)
        assert time.monotonic() - t0 < 20
    finally:
        _signal_board(b, signal.SIGCONT)
        board.close()


def test_host_deadline_and_fail_fast(boards) -> None:
    _lab, start = boards
    b = start("slow")
    target = fleet_targets.parse_target(b.target)

    def slow(t: fleet_targets.Target) -> report.HostResult:
        with _board(b, keepalive=0) as board:
            board.sh("sleep 600", what="a step that hangs", timeout=None)
        return report.HostResult(host=t.label, ok=True)

    t0 = time.monotonic()
    [r] = parallel.run_fleet([target], slow, host_timeout=2)
    assert not r.ok and "no result within the host deadline of 2 s" in r.error and time.monotonic() - t0 < 20
    # --fail-fast: one at a time, the first fails (nobody listens there), the others are skipped
    with emulated_board.socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = fleet_targets.parse_target(f"root@127.0.0.1:{s.getsockname()[1]}")

    def status(t: fleet_targets.Target) -> report.HostResult:
        with commands.Board(t, remote.SshOptions(ssh_config=b.ssh_config)):
            return report.HostResult(host=t.label, ok=True)

    results = parallel.run_fleet([dead, target, target], status, max_parallel=1, fail_fast=True)
    assert not results[0].ok and "cannot reach" in results[0].error
    assert [("skipped" in (r.error or "")) for r in results[1:]] == [True, True]
    assert all(r.ok for r in parallel.run_fleet([target, target], status, max_parallel=1, fail_fast=True))


def test_proxyjump_hops_get_the_same_strict_host_key_policy(boards, tmp_path: Path) -> None:
    _lab, start = boards
    jump, inner = start("jump"), start("inner")
    config = tmp_path / "ssh_config"
    known = tmp_path / "known_hosts"
    base = (f"  IdentityFile {jump.identity}\n  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n")
    config.write_text(f"Host inner-via-jump\n  HostName 127.0.0.1\n  Port {inner.port}\n  User {inner.user}\n"
                      f"  ProxyJump {jump.user}@127.0.0.1:{jump.port}\n{base}"
                      f"Host 127.0.0.1\n{base}")
    known.write_text(jump.host_key_line() + inner.host_key_line())
    env = dict(os.environ, BMOE_EDGE_SSH_CONFIG=str(config))
    assert_one_error(run_cli("status", "--host", "inner-via-jump", env=env, timeout=60), "no deploy found there")
    # the jump host's key unknown: refused (fabric's own hops would have accepted it)
    known.write_text(inner.host_key_line())
    line = assert_one_error(run_cli("status", "--host", "inner-via-jump", env=env, timeout=60), "unknown host key")
    assert f"jump host [127.0.0.1]:{jump.port}" in line
    assert f"[127.0.0.1]:{jump.port}" not in known.read_text()
    # @cert-authority / @revoked lines: a clear refusal, not a misread key
    known.write_text(jump.host_key_line() + inner.host_key_line() + "@revoked * ssh-ed25519 AAAAC3Nz\n")
    assert_one_error(run_cli("status", "--host", "inner-via-jump", env=env, timeout=60),
                     "@revoked lines are not supported", "UserKnownHostsFile")


def test_unit_is_off_the_boot_path_and_sandboxed() -> None:
    from bmoe_edge.boards import build

    text = systemd.render_job_unit((build.DEPLOY_DIR / "bmoe-edge-generate@.service").read_text(), "/opt/b e", "pi",
                                   ram_mb=8192)
    fields = dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln and not ln.startswith("#"))
    assert fields["Type"] == "exec" and fields["RuntimeMaxSec"] == "6h" and fields["MemoryMax"] == "7168M"
    assert fields["NoNewPrivileges"] == "yes" and fields["ProtectSystem"] == "strict"
    assert fields["ReadWritePaths"] == '"/opt/b e/jobs/%i"' and "TimeoutStartSec" not in fields
    assert not any(f"@{k}@" in text for k in ("INSTALL_DIR", "USER", "MEMORY_MAX", "RUNTIME_MAX"))


def test_wheel_lock_pins_dependency_wheels_by_hash(tmp_path: Path) -> None:
    from bmoe_edge.boards import build

    lock_file = tmp_path / build.WHEEL_LOCK
    wheels = [tmp_path / "typer-0.12.3-py3-none-any.whl", tmp_path / "PyYAML-6.0.2-cp311-manylinux.whl"]
    for i, w in enumerate(wheels):
        w.write_bytes(b"wheel %d" % i)
    said: list[str] = []
    build.check_wheel_lock(lock_file, wheels, said.append, update=True)     # build --update-lock
    text = lock_file.read_text()
    assert hashlib.sha256(b"wheel 0").hexdigest() + "  typer-0.12.3-py3-none-any.whl" in text and said
    build.check_wheel_lock(lock_file, wheels, said.append)       # the same wheels: accepted, nothing written
    assert lock_file.read_text() == text and len(said) == 1
    wheels[0].write_bytes(b"a replaced upload")
    with pytest.raises(BmoeError, match=r"typer-0\.12\.3-py3-none-any\.whl has sha256 .* pins"):
        build.check_wheel_lock(lock_file, wheels, said.append)


def test_a_build_downloads_the_locked_versions_not_the_newest(tmp_path: Path) -> None:
    """PyPI released uvicorn 0.55 while the lock had 0.54, and a fresh venv installed 0.55: the board's
    constraints must still name the locked 0.54 (the newest of the locked ones), so the build takes the
    reviewed wheels instead of refusing a version nobody locked; `--update-lock` follows this machine."""
    from importlib import metadata

    from bmoe_edge.boards import build

    lock_file = tmp_path / build.WHEEL_LOCK
    lock_file.write_text("# a lock\n" + "".join(
        f"{hashlib.sha256(n.encode()).hexdigest()}  {n}\n"
        for n in ("uvicorn-0.9.0-py3-none-any.whl", "uvicorn-0.10.1-py3-none-any.whl",
                  "annotated_types-0.0.1-py3-none-any.whl")))
    pins = build._constraints(lock_file, update=False)
    assert "uvicorn==0.10.1" in pins and "annotated_types==0.0.1" in pins
    assert not any(p.lower().startswith(("uvicorn==0.9", "annotated-types==", "annotated_types==0.8")) for p in pins)
    assert f"PyYAML=={metadata.version('pyyaml')}" in pins          # not locked: this machine's version
    followed = build._constraints(lock_file, update=True)
    assert f"uvicorn=={metadata.version('uvicorn')}" in followed and "uvicorn==0.10.1" not in followed


# ---------------------------------------------------------------------------------------------------
# Slow: a real bundle on emulated boards.


def _current_ok(inst: Path) -> str | None:
    """None when nothing is current yet; else the id `current` points at, which must be complete."""
    link = inst / "current"
    if not link.is_symlink():
        return None
    target = os.readlink(link)
    rel = inst / target
    assert target.startswith("releases/") and (rel / board_state.STAMP).is_file(), target
    assert (rel / "site").is_dir() and not (rel / board_state.FAILED).exists()
    return rel.name


@pytest.mark.slow
@pytest.mark.emulated
def test_two_deploys_at_once_one_waits_and_current_is_always_valid(boards, bundle_a: Path, bundle_b: Path,
                                                                   tmp_path: Path) -> None:
    lab_dir, start = boards
    b = start("race")
    inst = tmp_path / "inst"
    procs = [subprocess.Popen([sys.executable, "-m", "bmoe_edge", "deploy", "--bundle", str(src), "--host", b.target,
                               "--install-dir", str(inst), "--json"], env=_env(lab_dir), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for src in (bundle_a, bundle_b)]
    seen: set[str] = set()
    while any(p.poll() is None for p in procs):
        current = _current_ok(inst)
        if current:
            seen.add(current)
        time.sleep(0.02)
    outs = [p.communicate() for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert sum("waiting up to" in err and "board lock" in err for _out, err in outs) == 1, [e for _o, e in outs]
    ids = {bundle.load_manifest(x).bundle_id for x in (bundle_a, bundle_b)}
    assert seen <= ids and _current_ok(inst) in ids
    last = next(x for x in (bundle_a, bundle_b) if bundle.load_manifest(x).bundle_id == _current_ok(inst))
    _release_ok(inst, last)
    assert not list((inst / "releases").glob(".*.partial"))


@pytest.mark.slow
@pytest.mark.emulated
def test_a_held_lock_makes_a_deploy_fail_cleanly(boards, bundle_a: Path, tmp_path: Path) -> None:
    lab_dir, start = boards
    b = start("held")
    inst = tmp_path / "inst"
    with _board(b) as board, lock.board_lock(board, str(inst), action="a rollback"):
        result = run_cli("deploy", "--bundle", str(bundle_a), "--host", b.target, "--install-dir", str(inst),
                         "--lock-timeout", "1", env=_env(lab_dir), timeout=300)
    assert_one_error(result, "is locked by another run (a rollback by", "waited 1 s")
    assert not (inst / "current").exists() and not (inst / "releases").exists()


@pytest.mark.slow
@pytest.mark.emulated
def test_failed_health_check_rolls_back_and_the_release_is_never_picked_again(boards, bundle_a: Path,
                                                                               bundle_b: Path, tmp_path: Path) -> None:
    lab_dir, start = boards
    b = start("health")
    inst = tmp_path / "inst"
    target = fleet_targets.parse_target(b.target)
    a_id, b_id = (bundle.load_manifest(x).bundle_id for x in (bundle_a, bundle_b))
    [r] = deploy.deploy(bundle_a, [target], ssh_config=b.ssh_config, install_dir=str(inst), log=lambda _m: None)
    assert r.ok, r.error

    def break_it(release: str) -> None:    # after the switch: the new release no longer starts
        shutil.rmtree(Path(release) / "site" / "bmoe_edge")

    [r] = deploy.deploy(bundle_b, [target], ssh_config=b.ssh_config, install_dir=str(inst), log=lambda _m: None,
                        hooks={"after_switch": break_it})
    assert not r.ok and "health check failed after the switch" in r.error and f"rolled back to {a_id}" in r.error
    assert _release_ok(inst, bundle_a) == a_id
    assert (inst / "releases" / b_id / board_state.FAILED).is_file()
    state = json.loads((inst / "state.json").read_text())
    assert state["bundle_id"] == a_id and "failed" in state["releases"][b_id]
    # rollback never picks it; status is A, site verified
    result = run_cli("rollback", "--host", b.target, "--install-dir", str(inst), env=_env(lab_dir), timeout=300)
    assert_one_error(result, "no previous release", f"marked failed: {b_id}")
    status = _host(run_cli("status", "--host", b.target, "--install-dir", str(inst), "--json", env=_env(lab_dir),
                           timeout=120))
    assert status["ok"] and status["bundle_id"] == a_id
    # site/ tampered: status and a rollback to it refuse it, a redeploy of it repairs it
    site_file = inst / "releases" / a_id / "site" / "bmoe_edge" / "__init__.py"
    site_file.write_text(site_file.read_text() + "\n# tampered\n")
    result = run_cli("status", "--host", b.target, "--install-dir", str(inst), env=_env(lab_dir), timeout=120)
    assert_one_error(result, "site does not match the bundle's wheels")


@pytest.mark.slow
@pytest.mark.emulated
@pytest.mark.full_campaign
def test_fleet_with_a_killed_and_a_frozen_board(boards, bundle_a: Path, tmp_path: Path) -> None:
    """Five boards; mid-deploy (after its upload) one loses power (its sshd and sessions SIGKILLed) and one
    hangs (SIGSTOPped: the TCP connection stays up). The other three finish; the two are one row each."""
    _lab, start = boards
    fleet = [start(f"fleet-{i}") for i in range(5)]
    killed, frozen = fleet[3], fleet[4]
    dirs = {b.name: tmp_path / b.name for b in fleet}

    def uploaded(partial: str) -> None:
        for b, sig in ((killed, signal.SIGKILL), (frozen, signal.SIGSTOP)):
            if partial.startswith(str(dirs[b.name]) + "/"):
                _signal_board(b, sig)

    targets = [fleet_targets.Target("127.0.0.1", b.user, b.port, bundle_a.name, str(dirs[b.name])) for b in fleet]
    t0 = time.monotonic()
    results = deploy.deploy(bundle_a, targets, ssh_config=fleet[0].ssh_config, log=lambda _m: None,
                            hooks={"uploaded": uploaded}, keepalive=3.0)
    wall = time.monotonic() - t0
    by_port = {r.host.rsplit(":", 1)[1]: r for r in results}
    for b in fleet[:3]:
        assert by_port[str(b.port)].ok, by_port[str(b.port)].error
        _release_ok(dirs[b.name], bundle_a)
    assert not by_port[str(killed.port)].ok and not by_port[str(frozen.port)].ok
    assert "stopped answering" in by_port[str(frozen.port)].error
    assert not (dirs[killed.name] / "current").exists() and not (dirs[frozen.name] / "current").exists()
    table_text = report.format_table(results)
    assert table_text.splitlines()[-1] == "3 of 5 hosts ok, 2 failed"
    print(f"\nfleet of 5 with a dead and a hung board: {wall:.0f} s")


@pytest.mark.slow
@pytest.mark.emulated
@pytest.mark.full_campaign
def test_deploy_status_rollback_on_a_board_without_sftp(boards, bundle_a: Path, bundle_b: Path,
                                                        tmp_path: Path) -> None:
    lab_dir, start = boards
    b = start("dropbear-like", sftp=False)
    inst = tmp_path / "inst"
    for src in (bundle_a, bundle_b):
        result = run_cli("deploy", "--bundle", str(src), "--host", b.target, "--install-dir", str(inst), "--json",
                         env=_env(lab_dir), timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
    assert _release_ok(inst, bundle_b)
    status = _host(run_cli("status", "--host", b.target, "--json", env=_env(lab_dir), timeout=120))
    assert status["bundle_id"] == bundle.load_manifest(bundle_b).bundle_id
    result = run_cli("rollback", "--host", b.target, env=_env(lab_dir), timeout=300)
    assert result.returncode == 0, result.stderr
    assert _release_ok(inst, bundle_a)


@pytest.mark.slow
@pytest.mark.emulated
@pytest.mark.full_campaign
def test_deploys_killed_at_random_points_always_leave_a_valid_current(boards, bundle_a: Path, bundle_b: Path,
                                                                      tmp_path: Path) -> None:
    """A bounded campaign: $BMOE_EDGE_KILL_CAMPAIGN deploys (default 2, one kill per bundle; 50 with
    BMOE_EDGE_FULL_CAMPAIGNS=1),
    each SIGKILLed after a random delay; after each, `current` is absent or a complete verified release, and
    a final deploy succeeds."""
    lab_dir, start = boards
    b = start("campaign")
    inst = tmp_path / "inst"
    rounds = int(os.environ.get("BMOE_EDGE_KILL_CAMPAIGN", campaign_size(sample=2, full=50)))
    rng = random.Random(int(os.environ.get("BMOE_EDGE_KILL_SEED", "14")))
    bundles = {bundle.load_manifest(x).bundle_id: x for x in (bundle_a, bundle_b)}
    for i in range(rounds):
        src = (bundle_a, bundle_b)[i % 2]
        proc = subprocess.Popen([sys.executable, "-m", "bmoe_edge", "deploy", "--bundle", str(src), "--host",
                                 b.target, "--install-dir", str(inst)], env=_env(lab_dir),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 25.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        current = _current_ok(inst)
        if current:
            _release_ok(inst, bundles[current])
    result = run_cli("deploy", "--bundle", str(bundle_b), "--host", b.target, "--install-dir", str(inst), "--json",
                     env=_env(lab_dir), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _release_ok(inst, bundle_b)
    shutil.rmtree(inst, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.emulated
def test_push_model_resumes_verifies_and_swaps_by_rename(boards, bundle_a: Path, tmp_path: Path) -> None:
    lab_dir, start = boards
    b = start("models")
    inst = tmp_path / "inst"
    env = _env(lab_dir)
    result = run_cli("deploy", "--bundle", str(bundle_a), "--host", b.target, "--install-dir", str(inst), env=env,
                     timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    # a split model: every shard, into <install_dir>/models/, verified
    first = bundle_a / "fixtures" / "tiny-olmoe-Q8_0-split3-00001-of-00003.gguf"
    pushed = _host(run_cli("push-model", str(first), "--host", b.target, "--json", env=env, timeout=300))
    assert pushed["ok"] and pushed["files"] == 3 and pushed["files_uploaded"] == 3
    for shard in sorted(first.parent.glob("tiny-olmoe-Q8_0-split3-*.gguf")):
        assert (inst / "models" / shard.name).read_bytes() == shard.read_bytes()
    again = _host(run_cli("push-model", str(first), "--host", b.target, "--json", env=env, timeout=300))
    assert again["ok"] and again["bytes_uploaded"] == 0            # already there: nothing sent
    # interrupted (the CLI SIGKILLed mid-transfer), then resumed: only the rest travels, same sha256
    big = tmp_path / "big.gguf"
    big.write_bytes(os.urandom(96 << 20))
    dest = inst / "models" / "big.gguf"
    part = Path(str(dest) + ".bmoe-part")
    proc = subprocess.Popen([sys.executable, "-m", "bmoe_edge", "push-model", str(big), "--host", b.target],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (part.is_file() and part.stat().st_size > 8 << 20):
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    assert part.is_file() and not dest.exists(), "the push ended before it could be interrupted"
    kept = part.stat().st_size
    resumed = _host(run_cli("push-model", str(big), "--host", b.target, "--json", env=env, timeout=600))
    assert resumed["ok"] and resumed["bytes_uploaded"] <= big.stat().st_size - kept + (1 << 20)
    assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(big.read_bytes()).digest()
    assert not part.exists()
    # a partial that is not the start of the file is not trusted: sent again whole
    part.write_bytes(b"x" * 1000)
    (inst / "models" / "big.gguf").unlink()
    redo = _host(run_cli("push-model", str(big), "--host", b.target, "--json", env=env, timeout=600))
    assert redo["bytes_uploaded"] == big.stat().st_size and dest.read_bytes() == big.read_bytes()
    # a generation running while its model is replaced finishes with the file it opened
    model = inst / "models" / "story.gguf"
    qwen = bundle_a / "fixtures" / "tiny-qwen3moe-Q8_0.gguf"
    assert run_cli("push-model", str(qwen), "--host", b.target, "--to", str(model), env=env,
                   timeout=300).returncode == 0
    args = ["generate", "--host", b.target, "-m", str(model), "-p", "Once upon a time", "-n", "24", "--json"]
    before = run_cli(*args, env=env, timeout=600)
    assert before.returncode == 0, before.stderr[-2000:]
    proc = subprocess.Popen([sys.executable, "-m", "bmoe_edge", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first_line = proc.stdout.readline()                           # the run record: the model is open
    assert first_line.strip(), proc.stderr.read() if proc.stderr else ""
    other = next(p for p in sorted((bundle_a / "fixtures").glob("*.gguf")) if "split" not in p.name and p != qwen)
    swapped = run_cli("push-model", str(other), "--host", b.target, "--to", str(model), env=env, timeout=300)
    assert swapped.returncode == 0, swapped.stderr
    rest, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    ids = [r["id"] for r in map(json.loads, (first_line + rest).splitlines()) if r.get("type") == "token"]
    assert ids == [r["id"] for r in map(json.loads, before.stdout.splitlines()) if r.get("type") == "token"]
    assert model.read_bytes() != qwen.read_bytes()


@pytest.mark.slow
@pytest.mark.emulated
def test_boards_take_only_bundles_signed_by_a_key_they_trust(boards, bundle_a: Path, tmp_path: Path) -> None:
    lab_dir, start = boards
    b = start("signed")
    inst = tmp_path / "inst"
    env = _env(lab_dir)

    def run(src: Path, *extra: str, **more: str) -> subprocess.CompletedProcess[str]:
        return run_cli("deploy", "--bundle", str(src), "--host", b.target, "--install-dir", str(inst), *extra,
                       env=dict(env, **more), timeout=900)

    # the first deploy provisions the board's allowed_signers with the key this machine builds with
    result = run(bundle_a)
    assert result.returncode == 0, result.stderr[-3000:]
    allowed = (inst / "allowed_signers").read_text()
    assert signing.public_key().split()[1] in allowed and 'namespaces="bmoe-edge-bundle"' in allowed
    a_id = bundle.load_manifest(bundle_a).bundle_id
    # a manifest edited and re-hashed but not re-signed: refused on the board, before anything runs
    forged = changed_bundle(bundle_a, tmp_path / "forged" / bundle_a.name, "forged")
    shutil.copyfile(bundle_a / signing.SIGNATURE_NAME, forged / signing.SIGNATURE_NAME)
    assert_one_error(run(forged), "signature does not verify", "refusing it")
    assert _release_ok(inst, bundle_a) == a_id
    f_id = bundle.load_manifest(forged).bundle_id
    assert not (inst / "releases" / f_id).exists() and not (inst / "releases" / f".{f_id}.partial" / "site").exists()
    # unsigned: refused before any upload; --allow-unsigned takes it
    (forged / signing.SIGNATURE_NAME).unlink()
    assert_one_error(run(forged), "is not signed", "--allow-unsigned")
    result = run(forged, "--allow-unsigned")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _current_ok(inst) == f_id
    # another builder's key: refused until the board is told to trust it (--trust-key)
    other = tmp_path / "other" / "key"
    other_pub = signing.public_key(other)
    signing.sign_bundle(forged, other)
    assert_one_error(run(forged), "signature does not verify")
    key_file = tmp_path / "other.pub"
    key_file.write_text(other_pub + "\n")
    result = run(forged, "--trust-key", str(key_file))
    assert result.returncode == 0, result.stderr[-3000:]
    assert other_pub.split()[1] in (inst / "allowed_signers").read_text()
