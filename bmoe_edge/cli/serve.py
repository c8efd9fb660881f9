"""Commands of conversations: chat (a terminal conversation) and serve (an OpenAI-compatible server)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from bmoe_edge.cli.common import (
    AcceptNewOpt,
    HostOpt,
    InstallDirOpt,
    RpcHostOpt,
    RpcInventoryOpt,
    RpcPortOpt,
    SshConfigOpt,
    app,
    engine_options,
    fail,
    machine_config,
    on_board,
    rpc_tunnelled,
    sampling_options,
)
from bmoe_edge.engine import settings
from bmoe_edge.engine.prompt_cache import DEFAULT_CAP_BYTES, DEFAULT_FRACTION
from bmoe_edge.engine.rpc import DEFAULT_PORT as RPC_PORT
from bmoe_edge.serve import limits

KEY_ENV = "BMOE_EDGE_API_KEY"
ModelOpt = Annotated[Path, typer.Option("-m", "--model", help="The gguf model (first shard of a split model).")]
BoardOpt = Annotated[str | None, typer.Option("--board", help="Take the defaults from this board profile "
                                              "(default: this machine's: the deployed board's, else host).")]
TemplateOpt = Annotated[str | None, typer.Option(
    "--chat-template", help="A file with a model's Jinja template (any of llama.cpp's models/templates), or "
    "chatml (default: the model's own; ChatML when it has none).")]


@app.command("chat")
@engine_options()
@sampling_options()
def chat_cmd(
    model: ModelOpt,
    system: Annotated[str | None, typer.Option("--system", help="A system prompt.")] = None,
    think: Annotated[bool | None, typer.Option("--think/--no-think", help="Reasoning on or off where the "
                                               "model's template can switch it (default: the model's).")] = None,
    chat_template: TemplateOpt = None,
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", min=1, help="Per answer.")] = 1024,
    board: BoardOpt = None,
    *,
    engine: dict[str, Any],
    sampling: dict[str, Any],
) -> None:
    """Chat with a model in the terminal, streaming its experts (the conversation's context is kept, so
    each turn decodes only its new tokens)."""
    from bmoe_edge.engine import chat
    from bmoe_edge.engine.session import Engine
    from bmoe_edge.serve import terminal

    config = machine_config(board, engine, conversation=True)
    with Engine(model, config) as e:
        # --parse-special (an engine setting): message text may spell control tokens; off, it is refused.
        session = chat.Session(e, system=system, template=chat_template, think=think,
                               sampling=settings.sampling(sampling, conversation=True), max_tokens=max_tokens,
                               parse_special=config.parse_special)
        terminal.run(session)


@app.command("serve")
@engine_options()
def serve_cmd(
    model: ModelOpt,
    bind: Annotated[str, typer.Option("--bind", help="The address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8080,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar=KEY_ENV, help="Every request needs "
                                                "'Authorization: Bearer KEY' (/health excepted).")] = None,
    api_key_file: Annotated[Path | None, typer.Option("--api-key-file", help="Read the API key from this file "
                                                      "(a service's secret; never in `ps`); one key a line: "
                                                      "each key is a tenant of its own.")] = None,
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", help="A name clients reach this server by (the Host header), beside loopback and the "
        "bound address; repeat for more ('*': any, which lets DNS rebinding in).")] = None,
    cors_origin: Annotated[list[str] | None, typer.Option(
        "--cors-origin", help="A web origin (https://app.example) whose pages may call this server; repeat "
        "for more ('*': any). Without it, requests that carry an Origin are refused.")] = None,
    max_connections: Annotated[int, typer.Option(
        "--max-connections", min=1, help="Open connections at most (3 or more); past it, the one waiting "
        "longest for a request is closed.")] = 64,
    body_timeout: Annotated[float, typer.Option(
        "--body-timeout", min=0.1, help="Seconds a request's body may take to arrive (then 408).")] =
        limits.BODY_TIMEOUT_S,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="Listen beyond loopback without an API key "
                                          "(anyone who reaches the port can use the model).")] = False,
    local_port: Annotated[int | None, typer.Option(
        "--local-port", min=0, max=65535,
        help="With --host: this machine's port forwarded to the board's (default: --port).")] = None,
    queue: Annotated[int, typer.Option("--queue", min=1, help="Requests that may wait; more get 429.")] = 8,
    prompt_cache_mb: Annotated[int | None, typer.Option(
        "--prompt-cache-mb", min=0, help="Disk the prompt cache (long prompts' state files) may take, in MiB, "
        f"shared equally by the API keys; 0 turns it off (default: {DEFAULT_FRACTION:.0%} of its filesystem, at "
        f"most {DEFAULT_CAP_BYTES >> 20} MiB).")] = None,
    model_id: Annotated[str | None, typer.Option("--model-id", help="The name clients use (default: the "
                                                 "file's name).")] = None,
    chat_template: TemplateOpt = None,
    board: BoardOpt = None,
    host: HostOpt = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
    rpc_host: RpcHostOpt = None,
    rpc_port: RpcPortOpt = RPC_PORT,
    inventory: RpcInventoryOpt = None,
    *,
    engine: dict[str, Any],
) -> None:
    """An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health,
    /metrics) over one engine that streams the model's experts.

    With --host it runs on the board through its current release (-m is a path there), listening on
    the board's loopback only, and this machine's 127.0.0.1:--local-port is forwarded to it over SSH."""
    keys = _api_keys(api_key, api_key_file)
    if no_auth and keys:
        fail("--no-auth and an API key contradict each other: give one")
    if keys is not None:
        api_key = "\n".join(keys)
    if host and (allowed_host or cors_origin):
        fail("--allowed-host and --cors-origin are not forwarded to a board yet: the board's server listens on "
             "its loopback, reached here through 127.0.0.1")
    if host and (port == 0 or local_port == 0):
        fail("with --host, give fixed ports: --port (the board's) and --local-port (this machine's)")
    on_board(host, rpc_host=rpc_host, inventory=inventory, ssh_config=ssh_config,
             accept_new_host_key=accept_new_host_key,
             run=lambda onboard, target, options: onboard.board_serve(
                 target, str(model), onboard.serve_args(overrides=engine, queue=queue, model_id=model_id,
                                                        chat_template=chat_template) + _cache_args(prompt_cache_mb),
                 port=port, local_port=port if local_port is None else local_port, options=options,
                 api_key=api_key, board_name=board, install_dir=install_dir, say=lambda s: typer.echo(s, err=True)))
    from bmoe_edge.serve import server

    def say(line: str) -> None:
        typer.echo(line, err=True)

    with rpc_tunnelled(engine, rpc_host, rpc_port, inventory=inventory, ssh_config=ssh_config,
                       accept_new_host_key=accept_new_host_key, say=say) as flags:
        config = machine_config(board, flags, conversation=True)
        server.serve(model, config, bind=bind, port=port, api_keys=keys or (), no_auth=no_auth,
                     allowed_hosts=allowed_host or (), cors_origins=cors_origin or (),
                     max_connections=max_connections, body_timeout_s=body_timeout, queue_size=queue,
                     template=chat_template, parse_special=config.parse_special, model_id=model_id,
                     prompt_cache_mb=prompt_cache_mb, say=say)


def _cache_args(prompt_cache_mb: int | None) -> list[str]:
    """--prompt-cache-mb for the board's serve (onboard.serve_args forwards the others)."""
    return [] if prompt_cache_mb is None else ["--prompt-cache-mb", str(prompt_cache_mb)]


def _api_keys(api_key: str | None, api_key_file: Path | None) -> tuple[str, ...] | None:
    """The keys (None: none asked for). Fails closed: an empty or blank key, or a key file with no key
    in it, is an error, never a server without a key."""
    if api_key_file is not None:
        try:
            text = api_key_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read the API key file {api_key_file}: {getattr(exc, 'strerror', None) or exc}")
        keys = tuple(line.strip() for line in text.splitlines() if line.strip())
        if not keys:
            fail(f"the API key file {api_key_file} holds no key")
        return keys
    if api_key is None and os.environ.get(KEY_ENV) is not None:
        api_key = os.environ[KEY_ENV]   # set but empty: click takes that as unset; here it is an error
    if api_key is None:
        return None
    if not api_key.strip():
        fail("the API key (--api-key or $BMOE_EDGE_API_KEY) is empty")
    return (api_key.strip(),)
