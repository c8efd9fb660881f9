"""Long-running bmoe-edge services on a board under systemd: `deploy --service KIND` renders the unit,
installs it into /etc/systemd/system, enables and starts it, and waits for its health answer; `status`
shows each one. The kinds of service are rows of SERVICE_KINDS: a new kind is one row.

On the board:

    <install_dir>/systemd/bmoe-edge-<kind>.service    the unit as rendered (the copy systemd loads is in
                                                      /etc/systemd/system/)
    <install_dir>/services/<kind>/                    its working directory, the only place it may write;
                                                      `api-key` (0600) when it has one
    state.json "services": {<kind>: {...}}            what was installed (unit, model, bind, port, when)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from bmoe_edge.engine import serve_options
from bmoe_edge.engine.rpc import DEFAULT_PORT as RPC_PORT
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.commands import Board, tail
from bmoe_edge.fleet.report import Log, say
from bmoe_edge.fleet.scripts import SERVICE
from bmoe_edge.fleet.state import HEALTH_TIMEOUT, Layout, now, read_state, write_state
from bmoe_edge.fleet.systemd import memory_max, systemd_escape
from bmoe_edge.fleet.targets import Target
from bmoe_edge.net import is_loopback


@dataclass(frozen=True)
class ServiceKind:
    """One kind of service: the `bmoe-edge` command its unit runs and what that command takes."""

    name: str               # `deploy --service NAME`; the unit is bmoe-edge-NAME.service
    description: str
    command: str            # the bmoe-edge subcommand (run with --board <board> --bind B --port P)
    default_port: int
    needs_model: bool       # takes -m MODEL (a path on the board, read-only to the service)
    api_key: bool           # takes --api-key-file (the key kept in the service's directory, 0600)
    health_path: str | None  # an HTTP path answering 200 once it serves; None: the port accepting is health


SERVICE_KINDS = (
    ServiceKind("serve", "OpenAI-compatible server", "serve", serve_options.BY_NAME["port"].default,  # type: ignore[arg-type]
                needs_model=True, api_key=True,
                health_path="/health"),
    # A worker of another board's run (docs/rpc.md): loopback only, reached through the main board's
    # SSH tunnel; its health is its port accepting.
    ServiceKind("rpc-worker", "llama.cpp RPC worker", "rpc-worker", RPC_PORT, needs_model=False, api_key=False,
                health_path=None),
)
BY_NAME = {k.name: k for k in SERVICE_KINDS}
UNIT_TEMPLATE = "bmoe-edge-service.service"
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class ServiceSpec:
    kind: ServiceKind
    model: str | None = None
    bind: str = "127.0.0.1"
    port: int | None = None
    api_key: str | None = None
    no_auth: bool = False                 # no key on purpose (serve's --no-auth): an old key may go
    # serve's own options the unit passes on (serve_options' rows a service takes), as (name, value) pairs
    serve: tuple[tuple[str, object], ...] = ()

    @property
    def listen_port(self) -> int:
        return self.port if self.port is not None else self.kind.default_port


def kind_named(name: str) -> ServiceKind:
    if name not in BY_NAME:
        raise BmoeError(f"unknown service {name!r}: one of {', '.join(BY_NAME)}")
    return BY_NAME[name]


def spec_for(name: str, *, model: str | None, bind: str, port: int | None, api_key: str | None,
             serve: Mapping[str, object] | None = None, no_auth: bool = False) -> ServiceSpec:
    """A service as `deploy --service` describes it, checked before anything reaches a board. `serve`: serve's own
    options given (None or empty for none)."""
    kind = kind_named(name)
    given = serve_options.given(serve or {})
    if no_auth and (api_key or not kind.api_key):
        raise BmoeError("--no-auth goes with --service serve and without --api-key-file")
    if kind.api_key and serve_options.needs_key(bind, bool(api_key), no_auth):
        # serve refuses to listen beyond loopback without a key: the unit would only crash in a loop
        raise BmoeError(f"--service {name} --bind {bind}: listening beyond the board's loopback needs an API key "
                        "(--api-key-file FILE; --no-auth to mean it), or keep the default 127.0.0.1 and reach it "
                        "with `serve --host`")
    if given and kind.name != "serve":
        flags = ", ".join(serve_options.BY_NAME[k].flag for k in given)
        raise BmoeError(f"--service {name} takes no {flags} (serve's options)")
    serve_options.check_values([*given.get("allowed_host", ()), *given.get("cors_origin", ())],  # type: ignore[misc]
                               "--allowed-host/--cors-origin")
    for text in ("model_id", "chat_template"):
        if text in given:
            serve_options.check_values([str(given[text])], serve_options.BY_NAME[text].flag)
    if kind.needs_model and not model:
        raise BmoeError(f"--service {name} needs -m MODEL (the model's path on the board)")
    if model and not model.startswith("/"):
        raise BmoeError(f"-m {model!r}: give the model's absolute path on the board")
    if api_key and not kind.api_key:
        raise BmoeError(f"--service {name} takes no API key")
    if port == 0:
        raise BmoeError("--port: a service needs a fixed port")
    return ServiceSpec(kind, model, bind, port, api_key, no_auth, tuple(given.items()))


def for_target(target: Target, asked: ServiceSpec | None) -> ServiceSpec | None:
    """The service a deploy installs on this host: its role's (an inventory `role: rpc-worker` board
    always runs the worker, at its `rpc_port`), else the one `--service` asked for."""
    if target.role != "rpc-worker":
        return asked
    port = target.rpc_port
    if port is None and asked is not None and asked.kind.name == "rpc-worker":
        port = asked.port
    return ServiceSpec(BY_NAME["rpc-worker"], port=port)


START_LIMIT_BURST = 5        # the unit's StartLimitBurst= ...
START_LIMIT_INTERVAL = 600   # ... within StartLimitIntervalSec= (units/bmoe-edge-service.service)
RESTART_SEC = 5              # RestartSec=: a crash loop reaches the limit (5 x 5 s < 600 s)


def unit_name(kind: ServiceKind) -> str:
    return f"bmoe-edge-{kind.name}.service"


def workdir(layout: Layout, kind: ServiceKind) -> str:
    return f"{layout.install_dir}/services/{kind.name}"


def exec_argv(spec: ServiceSpec, layout: Layout, board_name: str) -> list[str]:
    """The service's command line: the board's bmoe-edge (the current release, its profiles) and the
    kind's command with the board profile's defaults."""
    argv = [f"{layout.install_dir}/bin/bmoe-edge", spec.kind.command, "--board", board_name]
    if spec.kind.needs_model:
        argv += ["-m", str(spec.model)]
    argv += ["--bind", spec.bind, "--port", str(spec.listen_port)]
    if spec.api_key:
        argv += ["--api-key-file", f"{workdir(layout, spec.kind)}/api-key"]
    elif spec.no_auth and not is_loopback(spec.bind):
        argv += ["--no-auth"]
    return argv + serve_options.as_flags(dict(spec.serve), "service")


def render_unit(spec: ServiceSpec, layout: Layout, user: str, board_name: str, ram_mb: int) -> str:
    def word(text: str) -> str:
        return f'"{systemd_escape(text)}"'

    template = resources.files(__package__).joinpath("units", UNIT_TEMPLATE).read_text(encoding="utf-8")
    read_only = [spec.model] if spec.model else [layout.install_dir]
    # ProtectHome=tmpfs hides every home; the release (bin/bmoe-edge, current, releases/) and the model
    # are bound back read-only, the service's directory writable (an install dir under /home works)
    bind_ro = [layout.install_dir, *([spec.model] if spec.model else [])]
    fields = {
        "@DESCRIPTION@": spec.kind.description, "@KIND@": spec.kind.name, "@BOARD@": board_name,
        "@USER@": systemd_escape(user), "@WORKDIR@": _bare_path(workdir(layout, spec.kind)),
        "@WRITABLE@": word(workdir(layout, spec.kind)),
        "@EXEC_START@": " ".join(word(a) for a in exec_argv(spec, layout, board_name)),
        "@MEMORY_MAX@": memory_max(ram_mb), "@READ_ONLY@": " ".join(word(p) for p in read_only),
        "@BIND_RO@": " ".join(word(p) for p in bind_ro),
        "@CACHE@": word(f"{workdir(layout, spec.kind)}/cache"),
    }
    for key, value in fields.items():
        template = template.replace(key, value)
    return template


def _bare_path(path: str) -> str:
    """A path for a setting that takes it unquoted (WorkingDirectory=): only specifiers are escaped."""
    if any(c in path for c in '"\\\n') or path != path.strip():
        raise BmoeError(f"{path!r} cannot be a service's directory in a systemd unit (quotes, backslashes or "
                        "spaces at the ends): choose another --install-dir")
    return path.replace("%", "%%")


def _parse_state(stdout: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in stdout.splitlines() if "=" in ln)


def unit_state(board: Board, kind: ServiceKind) -> dict[str, str]:
    """`systemd: no` on a board that does not run systemd; else the unit's ActiveState, SubState, …"""
    result = board.sh(SERVICE, "state", unit_name(kind), what=f"reading the {kind.name} service's state")
    return _parse_state(result.stdout)


def install_service(board: Board, layout: Layout, spec: ServiceSpec, *, board_name: str, ram_mb: int,
                    log: Log, health_timeout: float = HEALTH_TIMEOUT) -> dict[str, Any]:
    """Install, enable and (re)start the service, then wait for its health answer. The unit and the
    service's record in state.json are written first (status shows a service that did not start)."""
    kind = spec.kind
    unit = unit_name(kind)
    if spec.model:
        found = board.sh('test -f "$1"', spec.model, what="looking for the model", check=False)
        if found.exited != 0:
            raise BmoeError(f"{board.label}: the model {spec.model} is not on the board "
                            "(`bmoe-edge push-model` puts it there)")
    work = workdir(layout, kind)
    board.sh('mkdir -p -- "$1" "$2" && chmod 700 -- "$1"', work, f"{layout.install_dir}/systemd",
             what="creating the service's directory")
    if spec.api_key:
        board.write_bytes(f"{work}/api-key", spec.api_key.encode(), 0o600)
    else:
        had_key = board.sh('test -s "$1"', f"{work}/api-key", what="looking for an API key", check=False)
        if had_key.exited == 0 and kind.api_key and not spec.no_auth:   # never dropped by leaving it out
            raise BmoeError(f"{board.label}: the {kind.name} service there has an API key and this deploy gives "
                            "none: pass --api-key-file (the same key or a new one), or --no-auth to remove it")
        board.sh('rm -f -- "$1"', f"{work}/api-key", what="removing an old API key")
    rendered = f"{layout.install_dir}/systemd/{unit}"
    board.write_bytes(rendered, render_unit(spec, layout, board.conn.user, board_name, ram_mb).encode())
    record = {"unit": unit, "model": spec.model, "bind": spec.bind, "port": spec.listen_port,
              "installed_at": now(), "api_key": bool(spec.api_key)}
    state = read_state(board, layout)
    services = state.get("services") if isinstance(state.get("services"), dict) else {}
    state["services"] = {**services, kind.name: record}
    write_state(board, layout, state)
    say(log, board.label, f"starting the {kind.name} service ({unit})")
    started = board.sh(SERVICE, "start", unit, rendered, what=f"starting the {kind.name} service", check=False)
    if started.exited != 0:
        raise BmoeError(f"{board.label}: the {kind.name} service did not start: "
                        f"{tail(started.stderr or started.stdout)}")
    if _parse_state(started.stdout).get("systemd") == "no":
        raise BmoeError(f"{board.label}: the board does not run systemd (no /run/systemd/system), so the "
                        f"{kind.name} service was not started; its unit is {rendered}")
    wait_healthy(board, spec, timeout=health_timeout, unit=unit)
    say(log, board.label, f"{kind.name} service active, {spec.bind}:{spec.listen_port}")
    return record


def wait_healthy(board: Board, spec: ServiceSpec, *, timeout: float = HEALTH_TIMEOUT, unit: str | None = None) -> None:
    """Until the service answers on its port (its health path with 200), asked over the board's SSH
    connection (a direct-tcpip channel: nothing is needed on the board); a unit that fails meanwhile
    fails this."""
    port = spec.listen_port
    host = "127.0.0.1" if spec.bind in ("0.0.0.0", "::", "") else spec.bind
    deadline = time.monotonic() + timeout
    why = "no answer"
    while time.monotonic() < deadline:
        if unit is not None:
            state = unit_state(board, spec.kind)
            if state.get("ActiveState") == "failed":
                raise BmoeError(f"{board.label}: the {spec.kind.name} service failed "
                                f"({state.get('Result', '?')}): `journalctl -u {unit}` on the board")
        ok, why = _answers(board, host, port, spec.kind.health_path)
        if ok:
            return
        time.sleep(1)
    raise BmoeError(f"{board.label}: the {spec.kind.name} service did not answer on {host}:{port} within "
                    f"{timeout:.0f} s ({why})")


def _answers(board: Board, host: str, port: int, path: str | None) -> tuple[bool, str]:
    """One try: a channel to host:port on the board (refused while nothing listens), then the health
    path's status line over it."""
    import paramiko

    try:
        channel = board.conn.transport.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=10)
    except (paramiko.SSHException, OSError) as exc:
        return False, str(exc) or type(exc).__name__
    try:
        if path is None:
            return True, ""
        channel.settimeout(10)
        channel.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n" not in head and len(head) < 256:
            piece = channel.recv(256)
            if not piece:
                break
            head += piece
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        return status.split(" ")[1:2] == ["200"], status or "connection closed"
    except (OSError, TimeoutError) as exc:
        return False, str(exc) or type(exc).__name__
    finally:
        channel.close()


def restart_services(board: Board, layout: Layout, state: Mapping[str, Any], log: Log) -> None:
    """After `current` moved: restart the installed services into the new release (their units run
    bin/bmoe-edge, which follows `current`). A board without systemd has nothing running to restart."""
    for name, record in installed(state).items():
        kind = BY_NAME.get(name)
        rendered = f"{layout.install_dir}/systemd/{record.get('unit')}"
        if kind is None:
            continue
        result = board.sh(SERVICE, "start", unit_name(kind), rendered, what=f"restarting the {name} service",
                          check=False)
        if result.exited == 0 and _parse_state(result.stdout).get("systemd") == "yes":
            say(log, board.label, f"restarted the {name} service into the new release")


def installed(state: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    services = state.get("services")
    return {k: v for k, v in services.items() if isinstance(v, dict)} if isinstance(services, dict) else {}


def describe(board: Board, state: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each installed service with its state now (for `status`)."""
    out: dict[str, dict[str, Any]] = {}
    for name, record in installed(state).items():
        kind = BY_NAME.get(name)
        info = {**record}
        if kind is None:
            info["state"] = "unknown kind"
        else:
            now_state = unit_state(board, kind)
            if now_state.get("systemd") == "no":
                info["state"] = "not running (the board does not run systemd)"
            else:
                info["state"] = state_text(now_state, unit_name(kind))
                info["active"] = now_state.get("ActiveState") == "active"
        out[name] = info
    return out


def stopped_by_start_limit(now_state: Mapping[str, str]) -> bool:
    """Whether systemd's start limit left the unit failed. A crash loop does not say so in Result=: a
    restart refused by the limit keeps the crash's result (`signal`, `exit-code`; systemd 252 under a
    real crash loop: Result=signal, NRestarts=5, "Start request repeated too quickly", docs/deploy.md),
    only a start asked by hand while the limit holds says `start-limit-hit`. Under Restart=on-failure a
    failed unit with the limit's count of restarts is one systemd stopped restarting."""
    if now_state.get("Result") == "start-limit-hit":
        return True
    restarts = now_state.get("NRestarts", "0")
    return now_state.get("ActiveState") == "failed" and restarts.isdigit() and int(restarts) >= START_LIMIT_BURST


def state_text(now_state: Mapping[str, str], unit: str) -> str:
    """What `status` says of a unit (systemctl show's ActiveState, SubState, NRestarts, Result); a unit
    stopped by its start limit (a crash loop) says so, and what to do."""
    active, sub = now_state.get("ActiveState", "?"), now_state.get("SubState", "?")
    text = f"{active} ({sub})"
    restarts = now_state.get("NRestarts")
    if restarts and restarts != "0":
        text += f", {restarts} restarts"
    if stopped_by_start_limit(now_state):
        text += (f"; stopped by systemd's start limit: it crashed {START_LIMIT_BURST} times within "
                 f"{START_LIMIT_INTERVAL // 60} min (`journalctl -u {unit}` says why; a deploy, or `systemctl "
                 f"reset-failed {unit}` then start, runs it again)")
    elif active == "failed" and now_state.get("Result"):
        text += f"; result {now_state['Result']} (`journalctl -u {unit}`)"
    return text
