"""`bmoe-edge deploy`: releases on boards over SSH (fabric), safe to interrupt.

The jobs live beside this module: probe (what the board is), upload (and verify), install (and the
files beside the releases), state (the install dir), table (fleets and their reports); rollback and
status are in releases, gates and generate on a board in onboard.

On the board (`<install_dir>`: `--install-dir`, else the inventory's, else `ssh.install_dir` of this
checkout's profile of the board, or of the bundle's own once its signature holds here):

    <install_dir>/releases/<bundle_id>/           a complete release: the bundle as built (manifest.json,
                                                  wheels/, launcher/, fixtures/, profile/<board>.yaml)
                                                  + site/ (the wheels unpacked)
                                                  + .bmoe-release.json (the completeness stamp)
    <install_dir>/releases/.<bundle_id>.partial/  an upload/install in progress: a re-run resumes it
    <install_dir>/current -> releases/<bundle_id>
    <install_dir>/state.json                      bundle id, board, deployed_at, previous, gate results
    <install_dir>/bin/bmoe-edge                   runs the current release (put it on PATH on the board)
    <install_dir>/systemd/bmoe-edge-generate@.service   the headless-generation unit, for this install dir
    ~/.config/bmoe-edge/deploy.json               where the last deploy went (status/gates/generate --host
                                                  find the install dir with it)

A deploy of one host, in order; each step is a one-line BmoeError naming the host when it fails:

1. connect (strict host keys, on every ProxyJump hop too) and **probe** the board: `uname -m`, glibc,
   and the board's Python run the way the launcher will run it — directly on a real board, through the
   profile's `exec_wrapper` on an emulated one. Arch, Python and glibc are checked against the manifest
   **before anything is uploaded**;
2. take the **board lock** (lock.py) and hold it to the end: `releases/`, `current` and state.json are
   read under it; check the install dir is writable and has room;
3. **upload** into `releases/.<id>.partial/`, skipping files already there with the right sha256 and
   copying (on the board) files that another release there already has;
4. **verify** every file's sha256 on the board, and that the release holds no symlink and no unlisted file;
5. **install**: `launcher/bmoe-edge.sh --install-site` (stopped with the connection); site/ must hash to
   what the wheels unpack to, and the release must run (`--version`: the bundle's arch and the hook);
6. with `--gates`: the quick gates from the partial; any failing cell stops here: never stamped complete;
7. stamp it complete (with its site/ digest and gate result) and rename it to `releases/<id>`, synced;
8. verify again, then **switch** `current` atomically and durably (sync, one rename, sync);
9. **health check** through `current` (`--version`); on failure switch back, mark the release failed;
10. write state.json (synced), bin/bmoe-edge, the systemd unit and the pointer file, prune;
11. with `--service KIND` (or the inventory's `role: rpc-worker`: that board's service is the RPC
    worker): install, enable and start that systemd service and wait for its health answer
    (services.py); without it, a deploy that moved `current` restarts the services already installed.

Killing the command at any point leaves `current` on a complete, verified release (the switch is one
rename), the lock and everything the deploy ran on the board end with its connection, and running it
again finishes the job.
"""


from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bmoe_edge.boards import bundle
from bmoe_edge.boards.profiles import BoardProfile
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import remote
from bmoe_edge.fleet.commands import Board, tail
from bmoe_edge.fleet.install import (
    commit,
    gates_record,
    health_check,
    install,
    mark_failed,
    prune,
    record_failure,
    retried,
    run_gates,
    write_board_files,
)
from bmoe_edge.fleet.lock import LOCK_TIMEOUT, board_lock
from bmoe_edge.fleet.parallel import HOST_TIMEOUT, run_fleet
from bmoe_edge.fleet.probe import check_facts, checkout_profile, probe, probe_words
from bmoe_edge.fleet.remote import SshOptions
from bmoe_edge.fleet.report import HostResult, Log, say, stderr_log
from bmoe_edge.fleet.scripts import DEMOTE, REMOVE_IN, SWITCH
from bmoe_edge.fleet.services import ServiceSpec, for_target, install_service, restart_services
from bmoe_edge.fleet.state import (
    FAILED,
    KEEP,
    Hooks,
    Layout,
    Releases,
    list_releases,
    now,
    read_gates,
    read_state,
)
from bmoe_edge.fleet.targets import Target, load_inventory, parse_target
from bmoe_edge.fleet.trust import TrustOptions, check_not_older, check_trust, signed_here, verify_signature
from bmoe_edge.fleet.upload import LocalBundle, load_bundle, upload, verify_release, verify_site


def deploy_host(b: LocalBundle, target: Target, *, options: SshOptions, install_dir: str | None = None,
                keep: int = KEEP, gates: bool = False, log: Log, hooks: Hooks | None = None,
                lock_timeout: float = LOCK_TIMEOUT, health: bool = True,
                trust: TrustOptions | None = None, service: ServiceSpec | None = None) -> HostResult:
    m = b.manifest
    hooks = hooks or {}
    started = time.monotonic()
    # Before the signature holds nothing of the bundle is used but data: the login and the probe come
    # from this checkout's profile of the board; the bundle's own profile only after verification
    # (here, before connecting, for the login; on the board for the probe).
    checkout = checkout_profile(m.board)
    ssh = checkout.ssh if checkout is not None else b.profile.ssh if signed_here(b, trust or TrustOptions()) \
        else None
    board = Board(target, options, default_user=ssh.user if ssh else None,
                  default_port=ssh.port if ssh else None)
    result = HostResult(host=board.label, board=m.board)
    chosen = install_dir or target.install_dir or (ssh.install_dir if ssh else None)
    if not chosen:
        raise BmoeError(f"{board.label}: this checkout has no profile of board {m.board}, and bundle "
                        f"{m.bundle_id} is not signed by this machine's key (or --trust-key's): its own profile "
                        "does not choose where to install it; give --install-dir (or `install_dir:` in the "
                        "inventory)")
    layout = Layout(chosen)
    result.install_dir = layout.install_dir

    def probed(profile: BoardProfile, verified: bool) -> None:
        facts = probe(board, m, *probe_words(profile, m, verified=verified))
        say(log, board.label, f"board: {facts.arch} via {facts.via}; Python {facts.python}; glibc {facts.glibc}")
        check_facts(facts, m, board.label)

    with board:
        if checkout is not None:
            probed(checkout, verified=False)
        later = None if checkout is not None else (lambda: probed(b.profile, verified=True))
        with board_lock(board, layout.install_dir, action=f"deploy of {m.bundle_id}", wait=lock_timeout,
                        say=lambda text: say(log, board.label, text)):
            if "locked" in hooks:
                hooks["locked"](layout.install_dir)
            state = _deploy_locked(board, b, layout, result, keep=keep, gates=gates, log=log, hooks=hooks,
                                   health=health, trust=trust, verified=later)
            if service is not None:
                try:
                    installed = install_service(board, layout, service, board_name=m.board,
                                                ram_mb=b.profile.ram_mb, log=log)
                except BmoeError as exc:
                    raise BmoeError(f"{exc} ({m.bundle_id} itself is deployed)") from None
                result.services = {service.kind.name: installed}
            elif result.action == "deployed":
                restart_services(board, layout, state, log)
    result.ok = True
    result.bundle_id = m.bundle_id
    result.deployed_at = now()
    result.gates = result.gates or (read_gates(state, m.bundle_id))
    result.seconds = time.monotonic() - started
    return result


def _deploy_locked(board: Board, b: LocalBundle, layout: Layout, result: HostResult, *, keep: int, gates: bool,
                   log: Log, hooks: Hooks, health: bool, trust: TrustOptions | None,
                   verified: Callable[[], None] | None = None) -> dict[str, Any]:
    """The deploy, holding the board lock: `releases/` and `current` are read here, not before.
    `verified`: run once the bundle's signature held on the board (the probe of a board this checkout
    has no profile of), before anything of the bundle runs."""
    m = b.manifest
    trust = trust or TrustOptions()
    releases = list_releases(board, layout, create=True)
    check_signature = check_trust(board, layout, b, trust, log)
    check_not_older(board, layout, b, releases.current, m.bundle_id in releases.complete, trust)
    _ = b.site_sha256   # the signature held (or --allow-unsigned vouched): now unpack the wheels, if need be
    if not check_signature and verified is not None:
        verified()      # --allow-unsigned: the operator vouches for the bundle
        verified = None
    previous = releases.current
    final = layout.release(m.bundle_id)
    state = read_state(board, layout)
    if m.bundle_id in releases.complete:
        say(log, board.label, f"{m.bundle_id} is already on the board: verifying it")
        result.files = len(m.files) + 1
        result.files_present = result.files
        if check_signature:     # this bundle's signature (it may be newer than the one the release has)
            board.write_bytes(f"{final}/{bundle.SIGNATURE_NAME}", b.signed_bytes(bundle.SIGNATURE_NAME), 0o644,
                              durable=False)
            verify_signature(board, layout, final)
        if verified is not None:
            verified()
            verified = None
        try:
            verify_release(board, final, m, b.manifest_sha)
            verify_site(board, final, b.site_sha256)
        except BmoeError as exc:
            if releases.current == m.bundle_id:
                raise BmoeError(f"{exc} (it is the current release: `bmoe-edge rollback` first, then deploy "
                                "again to repair it)") from None
            say(log, board.label, f"{exc}; re-uploading it")
            board.sh(DEMOTE, final, layout.partial(m.bundle_id), what="reopening the release")
            releases.complete.pop(m.bundle_id)
            result.files_present = 0
    gate_record = None
    if m.bundle_id not in releases.complete:
        upload(board, b, layout, releases, result, log, hooks)
        if check_signature:    # before anything of it runs
            verify_signature(board, layout, layout.partial(m.bundle_id))
        if verified is not None:
            verified()
        install(board, b, layout, log)
        if gates:    # from the partial: a release is stamped complete only once its gates passed
            gate_record = _gates(board, layout.partial(m.bundle_id), m.bundle_id, previous, log)
            result.gates = gate_record
        commit(board, b, layout, releases, gate_record)
    elif gates:
        gate_record = _gates(board, final, m.bundle_id, previous, log)
        result.gates = gate_record
    if "before_switch" in hooks:
        hooks["before_switch"](final)
    try:
        verify_release(board, final, m, b.manifest_sha)
    except BmoeError:
        if releases.current != m.bundle_id:
            board.sh(DEMOTE, final, layout.partial(m.bundle_id), what="reopening the release")
        raise
    switching = releases.current != m.bundle_id
    if not switching:
        previous = state.get("previous") if isinstance(state.get("previous"), str) else None
    if switching or m.bundle_id in releases.failed:
        if switching:
            board.sh(SWITCH, layout.install_dir, m.bundle_id, what="switching current")
            say(log, board.label, f"current -> releases/{m.bundle_id}")
        if "after_switch" in hooks:
            hooks["after_switch"](final)
        if health:
            _health_or_undo(board, layout, m, previous, releases, state, log)
        if m.bundle_id in releases.failed:
            board.sh(REMOVE_IN, final, FAILED, what="clearing the failed mark")
        result.action = "deployed"
    else:
        result.action = "redeployed"
        say(log, board.label, f"{m.bundle_id} was already current")
    result.previous = previous
    write_board_files(board, b, layout, list_releases(board, layout, create=False), previous, gate_record, state)
    result.releases = prune(board, layout, keep, m.bundle_id, previous, log)
    return state


def _gates(board: Board, rel: str, bundle_id: str, previous: str | None, log: Log) -> dict[str, Any]:
    say(log, board.label, "running the gates on the board (quick matrix) before switching")
    t0 = time.monotonic()
    code, out, report = run_gates(board, rel)
    if report is None:
        raise BmoeError(f"{board.label}: the gates did not run (exit {code}): {tail(out)}")
    record = gates_record(report, bundle_id, quick=True)
    say(log, board.label, f"gates: {record['passed']} passed, {record['failed']} failed "
         f"({time.monotonic() - t0:.0f} s)")
    if code != 0 or record["failed"]:
        shown = "; ".join(record["failing"][:3]) or f"exit {code}"
        more = len(record["failing"]) - 3
        raise BmoeError(f"{board.label}: gates failed on the board ({record['failed']} of "
                        f"{record['failed'] + record['passed']} cells): {shown}"
                        + (f" (and {more} more)" if more > 0 else "")
                        + f"; `current` left at {previous or 'nothing'}")
    return record


def _health_or_undo(board: Board, layout: Layout, m: bundle.Manifest, previous: str | None, releases: Releases,
                    state: dict[str, Any], log: Log) -> None:
    """The smoke check after the switch; on failure `current` goes back to the release it replaced (when
    that one is not itself marked failed), the new one is marked failed, and the deploy fails."""
    try:
        retried(lambda: health_check(board, layout, m))
        return
    except BmoeError as exc:
        why = str(exc).removeprefix(f"{board.label}: ")
    mark_failed(board, layout.release(m.bundle_id), why)
    record_failure(board, layout, state, m.bundle_id, why)
    back = previous if previous and previous != m.bundle_id and previous not in releases.failed else None
    if back is None:
        raise BmoeError(f"{board.label}: health check failed after the switch ({why}); no earlier good release "
                        f"to go back to: {m.bundle_id} is marked failed")
    board.sh(SWITCH, layout.install_dir, back, what="switching current back")
    say(log, board.label, f"health check failed: current -> releases/{back} again")
    raise BmoeError(f"{board.label}: health check failed after the switch ({why}); rolled back to {back}, "
                    f"{m.bundle_id} is marked failed")


def resolve_targets(hosts: Sequence[str], inventory: Path | None, board: str | None,
                    profile_host: str | None = None) -> list[Target]:
    targets = [parse_target(h, board=board) for h in hosts]
    if inventory is not None:
        targets += [t if t.board or not board else replace(t, board=board) for t in load_inventory(inventory)]
    if not targets and profile_host:
        targets = [parse_target(profile_host, board=board)]
    if not targets:
        raise BmoeError("no host: give --host USER@HOST[:PORT] (repeatable) or --inventory FILE")
    return targets


def deploy(
    bundle_dir: Path | None,
    hosts: Sequence[Target | str],
    *,
    board: str | None = None,
    dist: Path = Path("dist"),
    keep: int = KEEP,
    gates: bool = False,
    accept_new_host_key: bool = False,
    ssh_config: Path | None = None,
    install_dir: str | None = None,
    log: Log | None = None,
    hooks: Hooks | None = None,
    max_parallel: int | None = None,
    fail_fast: bool = False,
    host_timeout: float | None = HOST_TIMEOUT,
    lock_timeout: float = LOCK_TIMEOUT,
    keepalive: float = remote.KEEPALIVE,
    health: bool = True,
    trust: TrustOptions | None = None,
    service: ServiceSpec | None = None,
) -> list[HostResult]:
    """Deploy a bundle (or each host's board's bundle under `dist/`) to every host, in parallel.

    A host's failure is its HostResult (ok False, error set); it never stops the others (with
    `fail_fast`, hosts not started yet are skipped). A host still at work after `host_timeout` seconds
    has its connections closed and fails with a deadline error.
    """
    if keep < 1:
        raise BmoeError(f"--keep must be at least 1 (got {keep})")
    log = log or stderr_log()
    options = SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key, keepalive=keepalive)
    targets = [parse_target(h, board=board) if isinstance(h, str) else h for h in hosts]
    if not targets:
        raise BmoeError("no host to deploy to")
    bundles: dict[Path, LocalBundle | BmoeError] = {}
    lock = threading.Lock()

    def bundle_for(target: Target) -> LocalBundle:
        name = target.board or board
        path = Path(bundle_dir) if bundle_dir is not None else (dist / name if name else None)
        if path is None:
            raise BmoeError(f"{target.label}: which board is it? give --board NAME (or `board:` in the inventory)")
        with lock:
            if path not in bundles:
                try:
                    if not (path / bundle.MANIFEST_NAME).is_file():
                        raise BmoeError(f"no bundle in {path}: build it with `bmoe-edge build --board "
                                        f"{name or '<board>'}`")
                    bundles[path] = load_bundle(path)     # its wheels are unpacked after its signature holds
                except BmoeError as exc:
                    bundles[path] = exc
            found = bundles[path]
        if isinstance(found, BmoeError):
            raise BmoeError(f"{target.label}: {found}")
        if name and found.manifest.board != name:
            raise BmoeError(f"{target.label}: the bundle in {path} is for board {found.manifest.board}, "
                            f"the host is a {name}")
        return found

    def work(target: Target) -> HostResult:
        return deploy_host(bundle_for(target), target, options=options, install_dir=install_dir, keep=keep,
                           gates=gates, log=log, hooks=hooks, lock_timeout=lock_timeout, health=health,
                           trust=trust, service=for_target(target, service))

    return run_fleet(targets, work, max_parallel=max_parallel, fail_fast=fail_fast, host_timeout=host_timeout,
                     what="deploy")
