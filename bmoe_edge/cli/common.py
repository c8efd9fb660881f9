"""The typer app, its sub-apps, and the options several commands share (SSH, engine settings)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from bmoe_edge.engine.rpc import DEFAULT_PORT as RPC_PORT
from bmoe_edge.engine.serve_options import BY_NAME, OPTIONS, ServeOption
from bmoe_edge.engine.settings import FLAG_SETTINGS, SAMPLING_FLAGS, Setting

app = typer.Typer(
    help="Run Mixture-of-Experts models bigger than a board's RAM, losslessly, by streaming experts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
llama_app = typer.Typer(help="The pinned llama.cpp source.", no_args_is_help=True)
app.add_typer(llama_app, name="llama")
profiles_app = typer.Typer(help="Board profiles: what each board is and how to build for it.",
                           no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")
bench_app = typer.Typer(help="Benchmarks: drive bandwidth, streamed vs llama.cpp mmap under a RAM cap, routing.",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


# Reaching boards over SSH (deploy, rollback, status, gates/generate --host); the logic is in bmoe_edge.fleet.
HostOpt = Annotated[str | None, typer.Option("--host", help="Run it on this board over SSH: USER@HOST[:PORT].")]
RpcHostOpt = Annotated[str | None, typer.Option(
    "--rpc-host", help="RPC workers on these boards, USER@HOST[:SSHPORT][,...], each reached through an SSH "
    "tunnel to its 127.0.0.1:--rpc-port (docs/rpc.md).")]
RpcPortOpt = Annotated[int, typer.Option("--rpc-port", min=1, max=65535, help="With --rpc-host: the workers' "
                                         "port on their boards (an inventory's `rpc_port` wins).")]
RpcInventoryOpt = Annotated[Path | None, typer.Option(
    "--inventory", help="RPC workers: this fleet inventory's `role: rpc-worker` boards, each reached through an "
    "SSH tunnel like --rpc-host (docs/rpc.md).")]
InstallDirOpt = Annotated[str | None, typer.Option(
    "--install-dir", help="Where releases live on the board (default: the inventory's, the profile's "
    "ssh.install_dir, or where the last deploy went).")]
SshConfigOpt = Annotated[Path | None, typer.Option(
    "--ssh-config", envvar="BMOE_EDGE_SSH_CONFIG", help="Read this ssh config instead of ~/.ssh/config "
    "(like ssh -F).")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new-host-key", help="Accept and record the key of a host not in known_hosts (never a changed one).")]


def _option(s: Setting) -> Any:
    """The typer annotation of a setting's option: None when not given (the profile's or the default)."""
    # A number that may be "auto" is text on the command line, typed by the setting's own check.
    kind = str if s.auto and s.kind is not bool else s.kind
    return Annotated[kind | None, typer.Option(*s.flags, help=s.help)]  # type: ignore[operator]


def _grouped(command: Callable[..., Any], added: list[inspect.Parameter], into: str,
             collect: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """`command` with the `added` options in its signature; it takes `<into>` instead: collect(their values)."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != into]
    names = [p.name for p in added]

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        grouped = collect({name: kwargs.pop(name) for name in names})   # popped before kwargs is passed on
        return command(**kwargs, **{into: grouped})

    run.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in [*own, *added]}
    return run


def setting_options(settings: Sequence[Setting], into: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command one option per setting (from the declared settings). The command takes
    `<into>: dict[str, object]` instead: the values given, None for those not given."""
    added = [inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=_option(s))
             for s in settings]
    return lambda command: _grouped(command, added, into, dict)


def engine_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """One option per engine setting; the command takes `engine: dict[str, object]`."""
    return setting_options(FLAG_SETTINGS, "engine")


def sampling_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """One option per sampling setting (--temp, --top-k, --top-p, --min-p, --seed); the command takes
    `sampling: dict[str, object]`."""
    return setting_options(SAMPLING_FLAGS, "sampling")


def _serve_annotation(o: ServeOption, help_prefix: str, given_only: bool) -> Any:
    kind: Any = list[o.kind] if o.many else o.kind  # type: ignore[name-defined]
    bounds = {k: v for k, v in (("min", o.minimum), ("max", o.maximum)) if v is not None}
    envvar = {"envvar": o.envvar} if o.envvar else {}
    if o.kind is bool:
        return Annotated[bool, typer.Option(*o.flags, help=help_prefix + o.help)]
    return Annotated[kind | None if (given_only or o.default is None or o.many) else kind,
                     typer.Option(*o.flags, help=help_prefix + o.help, **bounds, **envvar)]


def serve_options(rows: Sequence[ServeOption] = OPTIONS, *, help_prefix: str = "",
                  given_only: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """One option per row of serve's options (engine/serve_options.py); the command takes `serve: dict[str,
    object]`: each row's value (a repeated option as a tuple). `given_only` (deploy --service): every default
    is None (False for a switch), so only what was given is passed on."""

    def default(o: ServeOption) -> Any:
        if o.kind is bool:
            return False
        return None if (given_only or o.many) else o.default

    def collect(values: dict[str, Any]) -> dict[str, Any]:
        return {name: tuple(v or ()) if BY_NAME[name].many else v for name, v in values.items()}

    added = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=default(o),
                               annotation=_serve_annotation(o, help_prefix, given_only)) for o in rows]
    return lambda command: _grouped(command, added, "serve", collect)


@dataclass(frozen=True)
class Where:
    """Where a run happens: here (the default), on a board through its release (--host), or here with RPC
    workers on other boards (--rpc-host, --inventory)."""

    host: str | None = None
    install_dir: str | None = None
    ssh_config: Path | None = None
    accept_new_host_key: bool = False
    rpc_host: str | None = None
    rpc_port: int = RPC_PORT
    inventory: Path | None = None

    def on_board(self, run: Callable[[Any, Any, Any], int]) -> None:
        """With --host: `run(onboard, target, ssh_options)` on the board, and this process exits with its code."""
        on_board(self.host, rpc_host=self.rpc_host, inventory=self.inventory, ssh_config=self.ssh_config,
                 accept_new_host_key=self.accept_new_host_key, run=run)

    def rpc_tunnelled(self, engine: dict[str, Any], say: Callable[[str], None] | None
                      ) -> contextlib.AbstractContextManager[dict[str, Any]]:
        return rpc_tunnelled(engine, self.rpc_host, self.rpc_port, inventory=self.inventory,
                             ssh_config=self.ssh_config, accept_new_host_key=self.accept_new_host_key, say=say)


def where_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--host, --install-dir, --ssh-config, --accept-new-host-key, --rpc-host, --rpc-port, --inventory; the
    command takes `where: Where`."""
    annotations = {"host": HostOpt, "install_dir": InstallDirOpt, "ssh_config": SshConfigOpt,
                   "accept_new_host_key": AcceptNewOpt, "rpc_host": RpcHostOpt, "rpc_port": RpcPortOpt,
                   "inventory": RpcInventoryOpt}
    added = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                               annotation=annotations[f.name]) for f in dataclasses.fields(Where)]
    return lambda command: _grouped(command, added, "where", lambda values: Where(**values))


def machine_config(board: str | None, given: dict[str, Any], job: tuple[str, int] | None = None, *,
                   conversation: bool = False) -> Any:
    """The engine settings of a run here: the flags that were given over the profile of `board`, else of
    the machine this runs on (the deployed board's, else host). No knobs is the fast path. With `job`
    (`generate`'s prompt and -n), the context and batch not given are sized to it (runner.fit_to_job); for a
    `conversation` (serve, chat: prompts not known ahead), to the context (runner.fit_to_conversation)."""
    from bmoe_edge.boards import profiles
    from bmoe_edge.engine import runner, settings

    profile = profiles.load_profile(board or profiles.machine_board())
    config = settings.resolve(profile.engine, given)
    fixed = set(profile.engine) | {name for name, value in given.items() if value is not None}
    if job is not None:
        return runner.fit_to_job(config, *job, fixed=fixed)
    return runner.fit_to_conversation(config, fixed) if conversation else config


def on_board(host: str | None, *, rpc_host: str | None, inventory: Path | None, ssh_config: Path | None,
             accept_new_host_key: bool, run: Callable[[Any, Any, Any], int]) -> None:
    """Where a command runs. Without --host it returns and the command runs here. With --host,
    `run(onboard, target, ssh_options)` runs it on the board through its current release and this
    process exits with the board's exit code. RPC workers (--rpc-host, --inventory) belong to a run
    here: with --host, the main board starts its own."""
    if not host:
        return
    if rpc_host or inventory is not None:
        fail("--rpc-host and --inventory are for a run on this machine; with --host, start it on the main board "
             "itself")
    # fleet reaches boards with fabric, which a board does not have: imported only when a board is reached
    from bmoe_edge.fleet import onboard, remote

    options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
    raise typer.Exit(run(onboard, remote.parse_target(host), options))


@contextlib.contextmanager
def rpc_tunnelled(engine: dict[str, Any], rpc_host: str | None, rpc_port: int, *, inventory: Path | None = None,
                  ssh_config: Path | None, accept_new_host_key: bool,
                  say: Callable[[str], None] | None) -> Iterator[dict[str, Any]]:
    """The engine flags with the workers of --rpc-host and --inventory added to --rpc as the loopback ends
    of SSH tunnels, open for the block (unchanged without either)."""
    if not rpc_host and inventory is None:
        yield engine
        return
    from bmoe_edge.fleet import remote, tunnel

    targets = tunnel.parse_hosts(rpc_host or "")
    if inventory is not None:
        targets += tunnel.inventory_workers(inventory)
    options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
    with tunnel.rpc_tunnels(targets, options, rpc_port, say) as endpoints:
        given = engine.get("rpc")
        yield {**engine, "rpc": ",".join([*([given] if given else []), *endpoints])}
