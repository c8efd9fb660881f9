"""Commands of conversations: chat (a terminal conversation) and serve (an OpenAI-compatible server)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from bmoe_edge.cli.common import (
    Where,
    app,
    engine_options,
    fail,
    machine_config,
    sampling_options,
    serve_options,
    where_options,
)
from bmoe_edge.engine import serve_options as serve_rows
from bmoe_edge.engine import settings

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
@serve_options()
@where_options()
def serve_cmd(
    model: ModelOpt,
    local_port: Annotated[int | None, typer.Option(
        "--local-port", min=0, max=65535,
        help="With --host: this machine's port forwarded to the board's (default: --port).")] = None,
    board: BoardOpt = None,
    *,
    engine: dict[str, Any],
    serve: dict[str, Any],
    where: Where,
) -> None:
    """An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health,
    /metrics, and a chat page at /) over one engine that streams the model's experts.

    With --host it runs on the board through its current release (-m is a path there), listening on
    the board's loopback only, and this machine's 127.0.0.1:--local-port is forwarded to it over SSH."""
    keys = _api_keys(serve.pop("api_key"), serve.pop("api_key_file"))   # a BmoeError is cli.run's one line
    if serve["no_auth"] and keys:
        fail("--no-auth and an API key contradict each other: give one")
    bind, port = serve.pop("bind"), serve.pop("port")
    if where.host:
        _serve_on_board(model, board, engine, serve, where, keys, port=port, local_port=local_port)
    from bmoe_edge.serve import server

    def say(line: str) -> None:
        typer.echo(line, err=True)

    with where.rpc_tunnelled(engine, say) as flags:
        config = machine_config(board, flags, conversation=True)
        server.serve(model, config, bind=bind, port=port, api_keys=keys, no_auth=serve["no_auth"],
                     allowed_hosts=serve["allowed_host"], cors_origins=serve["cors_origin"],
                     max_connections=serve["max_connections"], body_timeout_s=serve["body_timeout"],
                     queue_size=serve["queue"], template=serve["chat_template"], parse_special=config.parse_special,
                     model_id=serve["model_id"], prompt_cache_mb=serve["prompt_cache_mb"],
                     with_ui=not serve["no_ui"], say=say)


def _serve_on_board(model: Path, board: str | None, engine: dict[str, Any], serve: dict[str, Any], where: Where,
                    keys: tuple[str, ...], *, port: int, local_port: int | None) -> None:
    """`serve --host`: the options the board's serve takes (serve_options' `board` column), the rest refused."""
    refused = serve_rows.refused_there(serve, "board")
    if refused:
        fail(refused)
    if port == 0 or local_port == 0:
        fail("with --host, give fixed ports: --port (the board's) and --local-port (this machine's)")
    forwarded = {o.name: serve[o.name] for o in serve_rows.reaching("board")}
    where.on_board(lambda onboard, target, options: onboard.board_serve(
        target, str(model), onboard.serve_args(overrides=engine, options=forwarded),
        port=port, local_port=port if local_port is None else local_port, options=options,
        api_key="\n".join(keys) or None, board_name=board, install_dir=where.install_dir,
        say=lambda s: typer.echo(s, err=True)))


def _api_keys(api_key: str | None, api_key_file: Path | None) -> tuple[str, ...]:
    """The keys (none asked for: empty). Fails closed: an empty or blank key, or a key file with no key in it,
    is an error, never a server without a key."""
    if api_key_file is not None:
        return serve_rows.read_api_keys(api_key_file)
    if api_key is None and os.environ.get(serve_rows.KEY_ENV) is not None:
        api_key = os.environ[serve_rows.KEY_ENV]   # set but empty: click takes that as unset; here an error
    if api_key is None:
        return ()
    if not api_key.strip():
        fail(f"the API key (--api-key or ${serve_rows.KEY_ENV}) is empty")
    return (api_key.strip(),)
