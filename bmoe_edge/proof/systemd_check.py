"""The serve unit under a real systemd (issue 44, item 9): boot one in a `systemd-nspawn` container of a
Debian 12 tree made by `debootstrap` (both from Debian's archive), install the unit that `deploy --service
serve` renders with deploy's own start script, and show it serving, its sandbox not stopping the engine,
a crash loop ending at the start limit and a client's failures not counting toward it.

    python -m bmoe_edge.proof.systemd_check [--json FILE]      # root, Linux; ~1.5 min (+2 the first time)
    ... --source DIR --client-rounds 5    # another revision's bmoe_edge/ under the unit (docs/deploy.md)

The container shares this machine's network (the service's port is reached from here on loopback) and
sees this checkout read-only at its own path; its board is laid out as deploy lays one out for a login
`pi` (`/home/pi/bmoe-edge`: bin/bmoe-edge, current -> releases/<id>, services/serve/api-key), except
that the release's launcher runs this checkout's code on the container's own python3 instead of a
bundle's unpacked wheels (the unit and everything it confines are deploy's). The tree is cached as a
tarball under ~/.cache/bmoe-edge/systemd-check/; every run unpacks a fresh copy and removes it, and
the container is powered off (killed after a deadline) whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmoe_edge.fleet.install import wrapper_script
from bmoe_edge.fleet.scripts import SERVICE
from bmoe_edge.fleet.services import (
    BY_NAME,
    START_LIMIT_BURST,
    exec_argv,
    render_unit,
    spec_for,
    state_text,
    unit_name,
    workdir,
)
from bmoe_edge.fleet.state import Layout

SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "curl", "libstdc++6", "procps")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bmoe-edge" / "systemd-check"
TARBALL = CACHE / f"{SUITE}-systemd.tar"
LOGIN, BOARD, RAM_MB = "pi", "host", 4096      # a Pi-sized board's MemoryMax; the `host` profile's engine
INSTALL_DIR = f"/home/{LOGIN}/bmoe-edge"      # under /home: ProtectHome=tmpfs must bind it back
MODEL = f"/home/{LOGIN}/models/tiny.gguf"
RELEASE_ID = "checkout"
SERVE = BY_NAME["serve"]
UNIT = unit_name(SERVE)
MACHINE = "bmoe-systemd-check"
BASELINE_UNIT = "bmoe-edge-baseline.service"  # the same command as a plain transient unit: no sandbox
# The exact request of issue 44 (1): a schema llama.cpp's grammar parser refuses.
CLIENT_FAILURE = {"messages": [{"role": "user", "content": "x"}],
                  "response_format": {"type": "json_schema", "json_schema": {
                      "name": "x", "schema": {"type": "array", "minItems": 5000}}}}
COMPLETION = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 24}
O_DIRECT = 0o40000                            # x86_64 and aarch64 alike
# What the journal says when a filter kills a process (SystemCallErrorNumber= makes most calls fail
# with EPERM instead, hence the checks of the calls' effects below).
KILLED_BY_FILTER = re.compile(r"SIGSYS|status=31/SYS|Bad system call|seccomp|core-dump", re.IGNORECASE)
BOOT_TIMEOUT, HEALTH_TIMEOUT, STEP_TIMEOUT = 120.0, 120.0, 60.0

# Stands in for a bundle's launcher/bmoe-edge.sh: this checkout (bound read-only at its own path) on
# the container's python3, its venv's packages added as a site directory (their .pth files included).
# With a source tree (`--source`: another revision's bmoe_edge/, this venv's native module copied in),
# that tree's bmoe_edge is imported instead of the checkout's editable install.
LAUNCHER = """#!/bin/sh
exec /usr/bin/python3 -c 'import runpy, site, sys
site.addsitedir(sys.argv.pop(1))
source = sys.argv.pop(1)
if source:
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "ScikitBuildRedirectingFinder"]
    sys.path.insert(0, source)
sys.argv[0] = "bmoe-edge"
runpy.run_module("bmoe_edge", run_name="__main__", alter_sys=True)' "{site}" "{source}" "$@"
"""
# The board's profile as a release carries it, with the expert cache off: every token's experts are
# read from the model (O_DIRECT, the read lanes), not served from memory after the first one.
PROFILE = f"extends: [{BOARD}]\nengine:\n  cache_mb: 0\n"
# Inside the container: what the engine's system calls left behind in /proc (its pid is the container's).
PROBE = r"""pid=$1; model=$2
for fd in /proc/$pid/fd/*; do
  [ "$(readlink "$fd")" = "$model" ] && sed -n 's/^flags:[[:space:]]*/model_fd_flags=/p' "/proc/$pid/fdinfo/${fd##*/}"
done
sed -n 's/^Threads:[[:space:]]*/threads=/p' "/proc/$pid/status"
echo "vmas_nohugepage=$(grep -c '^VmFlags:.* nh' "/proc/$pid/smaps")"
echo "vmas_hugepage=$(grep -c '^VmFlags:.* hg' "/proc/$pid/smaps")"
echo "vmas_dontfork=$(grep -c '^VmFlags:.* dc' "/proc/$pid/smaps")"
sed -n 's/^AnonHugePages:[[:space:]]*/anon_huge_pages=/p' "/proc/$pid/smaps_rollup"
sed -n 's/^Seccomp_filters:[[:space:]]*/seccomp_filters=/p' "/proc/$pid/status"
sed -n 's/^NoNewPrivs:[[:space:]]*/no_new_privs=/p' "/proc/$pid/status"
echo "home_seen=$(ls -A "/proc/$pid/root/home/pi" | tr '\n' ' ')"
echo "devices_seen=$(ls "/proc/$pid/root/dev" | wc -l)"
echo "memory_cgroup=$(sed -n 's/^[0-9]*:memory://p' "/proc/$pid/cgroup")"
"""

Say = Callable[[str], None]


def missing() -> str | None:
    """Why this machine cannot run the check (None: it can)."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (systemd-nspawn, debootstrap)"
    for tool in ("systemd-nspawn", "nsenter", "chroot", "tar"):
        if shutil.which(tool) is None:
            return f"no {tool} (apt-get install systemd-container)"
    if not TARBALL.is_file() and shutil.which("debootstrap") is None:
        return "no debootstrap and no cached tree (apt-get install debootstrap)"
    return None


def checkout_paths() -> tuple[Path, Path]:
    """This checkout and its venv's site-packages (bound into the container at the same paths)."""
    import bmoe_edge

    checkout = Path(bmoe_edge.__file__).resolve().parents[1]
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    return checkout, site


def tree_tarball(say: Say) -> Path:
    """The Debian tree with systemd, made once by debootstrap and kept as a tarball."""
    if TARBALL.is_file():
        return TARBALL
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        tree = Path(work) / "tree"
        say(f"debootstrap {SUITE} (once; cached as {TARBALL})")
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tree),
                        MIRROR], check=True, stdout=subprocess.DEVNULL, timeout=1800)
        partial = TARBALL.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(tree), "--numeric-owner", "-cf", str(partial), "."], check=True,
                       timeout=600)
        partial.rename(TARBALL)
    return TARBALL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prepare(root: Path, model: Path, port: int, api_key: str, say: Say, source: Path | None = None) -> str:
    """Unpack the tree and lay the board out as deploy does; returns the rendered unit's path in it."""
    subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-xpf", str(tree_tarball(say))], check=True,
                   timeout=600)
    subprocess.run(["chroot", str(root), "useradd", "-m", "-U", "-s", "/bin/sh", LOGIN], check=True, timeout=60)
    layout = Layout(INSTALL_DIR)
    spec = spec_for(SERVE.name, model=MODEL, bind="127.0.0.1", port=port, api_key=api_key)
    release = root / layout.release(RELEASE_ID).lstrip("/")
    _, site = checkout_paths()
    files = {
        f"{INSTALL_DIR}/bin/bmoe-edge": (wrapper_script(INSTALL_DIR), 0o755),
        f"{layout.release(RELEASE_ID)}/launcher/bmoe-edge.sh": (LAUNCHER.format(site=site, source=source or ""), 0o755),
        f"{layout.release(RELEASE_ID)}/profile/{BOARD}.yaml": (PROFILE, 0o644),
        f"{workdir(layout, SERVE)}/api-key": (api_key, 0o600),
        f"{INSTALL_DIR}/systemd/{UNIT}": (render_unit(spec, layout, LOGIN, BOARD, RAM_MB), 0o644),
    }
    for path, (text, mode) in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)
    (root / layout.current.lstrip("/")).symlink_to(release.relative_to(root / INSTALL_DIR.lstrip("/")))
    (root / MODEL.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, root / MODEL.lstrip("/"))
    (root / workdir(layout, SERVE).lstrip("/")).chmod(0o700)
    subprocess.run(["chroot", str(root), "chown", "-R", f"{LOGIN}:{LOGIN}", f"/home/{LOGIN}"], check=True,
                   timeout=60)
    return f"{INSTALL_DIR}/systemd/{UNIT}"


@dataclass
class Container:
    """A booted container: its nspawn process and its systemd (PID 1 inside, `pid1` here)."""

    nspawn: subprocess.Popen
    pid1: int

    def run(self, *argv: str, timeout: float = STEP_TIMEOUT, check: bool = False) -> subprocess.CompletedProcess:
        """A command inside the container (its namespaces: mounts, PIDs, its systemd's bus)."""
        return subprocess.run(["nsenter", "-t", str(self.pid1), "-a", *argv], capture_output=True, text=True,
                              timeout=timeout, check=check)

    def sh(self, script: str, *args: str, timeout: float = STEP_TIMEOUT) -> subprocess.CompletedProcess:
        return self.run("sh", "-c", script, "sh", *args, timeout=timeout)

    def show(self, unit: str) -> dict[str, str]:
        out = self.run("systemctl", "show", "-p", "ActiveState,SubState,Result,NRestarts,MainPID,ExecMainStatus",
                       unit).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str) -> str:
        return self.run("journalctl", "-u", unit, "--no-pager", "-o", "short-monotonic").stdout


def _container_init(nspawn_pid: int) -> int | None:
    """nspawn's child once it is systemd: before its exec it is nspawn's own fork, whose namespaces may
    still be this machine's."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == nspawn_pid and (stat.parent / "comm").read_text().strip() == "systemd":
                return int(stat.parent.name)
    return None


@contextlib.contextmanager
def booted(root: Path, log: Path, binds: list[Path], say: Say) -> Iterator[Container]:
    """`systemd-nspawn --boot` on the tree; powered off (or killed) on the way out, whatever happened.
    --register=no --keep-unit: this machine's PID 1 is not systemd (no machined, no scope to make)."""
    argv = ["systemd-nspawn", "-D", str(root), "--boot", "--register=no", "--keep-unit", f"--machine={MACHINE}",
            "--console=passive", *(f"--bind-ro={p}" for p in binds)]
    with log.open("w") as out:
        nspawn = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    container = None
    try:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while container is None and time.monotonic() < deadline and nspawn.poll() is None:
            init = _container_init(nspawn.pid)
            container = Container(nspawn, init) if init else None
            time.sleep(0.5)
        if container is None:
            raise RuntimeError(f"no container init within {BOOT_TIMEOUT:.0f} s: {log.read_text()[-2000:]}")
        state = container.run("systemctl", "is-system-running", "--wait", timeout=BOOT_TIMEOUT).stdout.strip()
        say(f"booted: systemd-nspawn pid {nspawn.pid}, its systemd {container.pid1}; is-system-running: {state}")
        yield container
    finally:
        if container is not None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                container.run("systemctl", "poweroff", "--no-block", timeout=30)
        try:
            nspawn.wait(timeout=60)
        except subprocess.TimeoutExpired:
            say("the container did not power off within 60 s: killed")
            for pid in [nspawn.pid] + ([container.pid1] if container else []):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            nspawn.wait(timeout=30)


def http(port: int, path: str, body: dict[str, Any] | None = None, key: str | None = None,
         timeout: float = STEP_TIMEOUT) -> tuple[int, str]:
    """One request from this machine to the service (the container shares its loopback)."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def wait_healthy(container: Container, unit: str, port: int, timeout: float = HEALTH_TIMEOUT) -> float:
    """Seconds until /health answers 200; fails if the unit fails first."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if container.show(unit).get("ActiveState") == "failed":
            raise RuntimeError(f"{unit} failed:\n{container.journal(unit)[-3000:]}")
        if http(port, "/health", timeout=5)[0] == 200:
            return time.monotonic() - start
        time.sleep(1)
    raise RuntimeError(f"{unit}: no /health 200 within {timeout:.0f} s:\n{container.journal(unit)[-3000:]}")


def probe(container: Container, unit: str) -> dict[str, Any]:
    """What the engine's system calls left in /proc: the model's descriptors (O_DIRECT), threads, the
    madvise flags of its mappings."""
    pid = container.show(unit).get("MainPID", "0")
    out = container.sh(PROBE, pid, MODEL).stdout
    flags = [int(v, 8) for k, v in (ln.split("=", 1) for ln in out.splitlines() if "=" in ln)
             if k == "model_fd_flags"]
    found: dict[str, Any] = dict(ln.split("=", 1) for ln in out.splitlines()
                                 if "=" in ln and not ln.startswith("model_fd_flags"))
    return {"pid": pid, "model_fds": len(flags), "model_fds_o_direct": sum(1 for f in flags if f & O_DIRECT),
            **{k: int(v.split()[0]) if v[:1].isdigit() else v.strip() for k, v in found.items()}}


def expert_bytes_read(port: int, key: str) -> float:
    status, text = http(port, "/metrics", key=key)
    match = re.search(r"^bmoe_expert_bytes_read_total (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if status == 200 and match else -1.0


def completion_in_container(container: Container, port: int, key: str) -> dict[str, Any]:
    """One chat completion asked with curl inside the container."""
    out = container.run("curl", "-sS", "-m", "60", "-H", f"Authorization: Bearer {key}", "-H",
                        "Content-Type: application/json", "-d", json.dumps(COMPLETION),
                        f"http://127.0.0.1:{port}/v1/chat/completions", timeout=90).stdout
    answer = json.loads(out)
    return {"finish_reason": answer["choices"][0]["finish_reason"], "usage": answer["usage"]}


def check_serving(c: Container, rendered: str, port: int, key: str, say: Say) -> dict[str, Any]:
    """(1) and (2): deploy's start script installs and starts the unit; it serves; the engine's calls work."""
    started = c.sh(SERVICE, "start", UNIT, rendered, timeout=120)
    say(f"service.sh start: exit {started.returncode}: {' '.join(started.stdout.split())}")
    healthy_after = wait_healthy(c, UNIT, port)
    health = http(port, "/health")
    say(f"/health from this machine after {healthy_after:.1f} s: {health[0]} {health[1]}")
    answer = completion_in_container(c, port, key)
    say(f"curl in the container: chat completion {answer}")
    found = probe(c, UNIT)
    found["expert_bytes_read"] = expert_bytes_read(port, key)
    say(f"engine under the unit: {found}")
    journal = c.journal(UNIT)
    kills = [ln for ln in journal.splitlines() if KILLED_BY_FILTER.search(ln)]
    state = c.show(UNIT)
    say(f"unit: {state}; journal lines naming a filter kill: {len(kills)}")
    return {"start_exit": started.returncode, "start_out": started.stdout, "health": health,
            "healthy_after_s": round(healthy_after, 1), "completion": answer, "engine": found,
            "filter_kills": kills, "state": state, "journal": journal.splitlines()[-40:]}


def check_baseline(c: Container, port: int, key: str, say: Say) -> dict[str, Any]:
    """The same command, user and model in a transient unit without the sandbox: what (2) compares with."""
    spec = spec_for(SERVE.name, model=MODEL, bind="127.0.0.1", port=port, api_key=key)
    argv = exec_argv(spec, Layout(INSTALL_DIR), BOARD)
    c.run("systemd-run", f"--unit={BASELINE_UNIT}", "-p", f"User={LOGIN}", "-p",
          f"WorkingDirectory={workdir(Layout(INSTALL_DIR), SERVE)}", *argv, check=True)
    try:
        wait_healthy(c, BASELINE_UNIT, port)
        completion_in_container(c, port, key)
        found = {**probe(c, BASELINE_UNIT), "expert_bytes_read": expert_bytes_read(port, key)}
    finally:
        c.run("systemctl", "stop", BASELINE_UNIT)
    say(f"engine without the sandbox: {found}")
    return found


def check_client_failures(c: Container, port: int, key: str, say: Say, rounds: int = 1) -> list[dict[str, Any]]:
    """(4): three requests whose schema llama.cpp refuses, `rounds` times, must not make the unit restart
    (a server that counts them as engine failures exits after three; five rounds then meet the limit)."""
    done: list[dict[str, Any]] = []
    for _ in range(rounds):
        before = c.show(UNIT)
        if before.get("ActiveState") == "failed":
            break
        wait_healthy(c, UNIT, port)
        answers = [http(port, "/v1/chat/completions", CLIENT_FAILURE, key) for _ in range(3)]
        time.sleep(12)   # past RestartSec=5 and a model load: a restart the requests caused has happened
        after = c.show(UNIT)
        health = http(port, "/health", timeout=5)
        say(f"three refused schemas: {[a[0] for a in answers]}; NRestarts {before.get('NRestarts')} -> "
            f"{after.get('NRestarts')}, MainPID {before.get('MainPID')} -> {after.get('MainPID')}, "
            f"{after.get('ActiveState')}; /health {health[0]}")
        done.append({"statuses": [a[0] for a in answers], "bodies": [a[1][:300] for a in answers],
                     "before": before, "after": after, "health_after": health})
    return done


def check_crash_loop(c: Container, port: int, say: Say) -> dict[str, Any]:
    """(3): kill -9 the server each time it runs again until systemd stops restarting it."""
    c.run("systemctl", "stop", UNIT)
    c.run("systemctl", "reset-failed", UNIT)
    c.run("systemctl", "start", UNIT, check=True)
    kills: list[dict[str, str]] = []
    last_pid = "0"
    for _ in range(START_LIMIT_BURST + 3):          # the limit is reached at the 5th kill; bounded anyway
        state = _next_run(c, last_pid)
        if state.get("ActiveState") == "failed":
            break
        last_pid = state["MainPID"]
        c.run("kill", "-9", last_pid)
        kills.append({"killed": last_pid, "NRestarts": state.get("NRestarts", "?")})
    state = c.show(UNIT)
    status = c.run("systemctl", "status", UNIT, "--no-pager", "-l", "-n", "12").stdout
    said = state_text(state, UNIT)
    say(f"crash loop: {len(kills)} kills, then {state}; bmoe-edge status would say: {said}")
    reset = c.run("systemctl", "reset-failed", UNIT)
    c.run("systemctl", "start", UNIT, check=True)
    again = wait_healthy(c, UNIT, port)
    say(f"reset-failed (exit {reset.returncode}) and start: /health 200 after {again:.1f} s")
    return {"kills": kills, "state": state, "status": status.splitlines(), "status_text": said,
            "after_reset": c.show(UNIT)}


def _next_run(c: Container, last_pid: str) -> dict[str, str]:
    """The unit once it runs a process other than `last_pid`, or has failed (bounded in time)."""
    deadline = time.monotonic() + STEP_TIMEOUT
    state = c.show(UNIT)
    while time.monotonic() < deadline:
        state = c.show(UNIT)
        running = state.get("SubState") == "running" and state.get("MainPID") not in ("0", last_pid)
        if running or state.get("ActiveState") == "failed":
            return state
        time.sleep(0.5)
    raise RuntimeError(f"{UNIT} neither ran again nor failed within {STEP_TIMEOUT:.0f} s: {state}")


def run(say: Say = print, model: Path | None = None, source: Path | None = None,
        client_rounds: int = 1) -> dict[str, Any]:
    """The whole check; returns what each part showed (see the module's docstring)."""
    reason = missing()
    if reason:
        raise RuntimeError(f"cannot run here: {reason}")
    hidden = [d for d in ("/tmp", "/var/tmp", "/home", "/root") if source and source.is_relative_to(d)]
    if hidden:   # the unit's PrivateTmp= and ProtectHome= hide these from the service
        raise RuntimeError(f"--source {source}: the service cannot see {hidden[0]}; put it elsewhere (/srv, /opt)")
    checkout, site = checkout_paths()
    binds = [checkout, *([] if site.is_relative_to(checkout) else [site]), *([source] if source else [])]
    port, key = free_port(), secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="bmoe-systemd-check-", dir="/var/tmp") as work:
        root = Path(work) / "root"
        root.mkdir()
        if model is None:
            model = Path(work) / "tiny.gguf"
            subprocess.run([sys.executable, "-m", "bmoe_edge", "tiny-model", "--arch", "qwen3moe", "--quant", "F32",
                            "-o", str(model)], check=True, capture_output=True, timeout=300)
        rendered = prepare(root, model, port, key, say, source)
        report: dict[str, Any] = {"port": port, "unit": (root / rendered.lstrip("/")).read_text()}
        try:
            with booted(root, Path(work) / "nspawn.log", binds, say) as c:
                report["system"] = {"is_system_running": c.run("systemctl", "is-system-running").stdout.strip(),
                                    "virt": c.run("systemd-detect-virt").stdout.strip(),
                                    "systemd": c.run("systemctl", "--version").stdout.splitlines()[0],
                                    "cgroup": c.run("stat", "-fc", "%T", "/sys/fs/cgroup").stdout.strip()}
                report["serving"] = check_serving(c, rendered, port, key, say)
                report["baseline"] = check_baseline(c, free_port(), key, say)
                report["client_failures"] = check_client_failures(c, port, key, say, client_rounds)
                report["crash_loop"] = check_crash_loop(c, port, say)
        finally:
            _forget_propagation_dir()
    return report


def _forget_propagation_dir() -> None:
    """nspawn leaves /run/systemd/nspawn/propagate/<machine>/ behind (it does not remove it when the
    host's PID 1 is not systemd: "Attempted to remove disk file system ... we can't allow that")."""
    left = Path("/run/systemd/nspawn/propagate") / MACHINE
    if left.is_dir() and not any(left.iterdir()):
        left.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the whole report here")
    parser.add_argument("--source", type=Path, help="run this tree's bmoe_edge/ (another revision: `git archive "
                        "REV bmoe_edge board_profiles`, this venv's _native module copied into it)")
    parser.add_argument("--client-rounds", type=int, default=1, help="rounds of three refused schemas")
    args = parser.parse_args(argv)
    report = run(source=args.source.resolve() if args.source else None, client_rounds=args.client_rounds)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    for line in report["crash_loop"]["status"]:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
