"""`serve`'s own options are declared once (bmoe_edge/engine/serve_options.py) and reach every place a server starts
from those rows: `serve` here, `serve --host` on a board (fleet/onboard.py), the unit of `deploy --service serve`
(fleet/services.py). An option added in one place only fails here: serve's command line holds nothing but the rows,
the where group, the engine settings and its three own options; whatever a row forwards parses back, through serve's
own command line, to the value given."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
import typer.main

from bmoe_edge.cli import app
from bmoe_edge.cli.common import Where
from bmoe_edge.engine import serve_options
from bmoe_edge.engine.serve_options import OPTIONS, Reach
from bmoe_edge.engine.settings import FLAG_SETTINGS
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import onboard, services
from bmoe_edge.fleet.state import Layout

# serve's options that are not serve_options' rows, each for a reason: the model and the board profile are every run
# command's; --local-port is this machine's end of serve --host's tunnel.
OWN = {"model", "board", "local_port"}


def _command(name: str) -> click.Command:
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def _long_flags(command: click.Command) -> set[str]:
    return {flag for p in command.params for flag in p.opts if flag.startswith("--")}


def _sample(option: serve_options.ServeOption) -> object:
    """A value other than the default, within the row's bounds."""
    if option.kind is bool:
        return True
    if option.many:
        return ("boards.example", "pi5.local")
    if option.kind is int:
        return (option.default if isinstance(option.default, int) else int(option.minimum or 0)) + 7
    if option.kind is float:
        return 42.5
    return "sample-value"


def _parsed(args: list[str]) -> dict[str, object]:
    """serve's own command line parsing `args`: the values its parameters get."""
    context = _command("serve").make_context("serve", list(args), resilient_parsing=True)
    return context.params


def _same(option: serve_options.ServeOption, parsed: object, given: object) -> bool:
    return tuple(parsed) == tuple(given) if option.many else parsed == given  # type: ignore[arg-type]


def test_serve_takes_its_rows_and_nothing_by_hand() -> None:
    names = {p.name for p in _command("serve").params}
    rows = {o.name for o in OPTIONS}
    unexplained = names - rows - {s.name for s in FLAG_SETTINGS} - set(Where.__dataclass_fields__) - OWN
    assert not unexplained, f"serve options that are not rows of engine/serve_options.py: {sorted(unexplained)}"
    assert rows <= names
    # each row's flag is the one serve parses it by
    assert {o.flag for o in OPTIONS} <= _long_flags(_command("serve"))


def test_deploy_takes_the_rows_a_service_takes() -> None:
    deploy = _long_flags(_command("deploy"))
    for option in OPTIONS:
        if option.service is Reach.FORWARDED:
            assert option.flag in deploy, f"deploy --service serve does not take {option.flag}"


def test_a_row_not_taken_somewhere_says_why() -> None:
    for option in OPTIONS:
        if (option.board, option.service) != (Reach.FORWARDED, Reach.FORWARDED):
            assert option.why, f"{option.flag}: not forwarded everywhere, and no reason given"


@pytest.mark.parametrize("option", serve_options.reaching("service"), ids=lambda o: o.flag)
def test_the_unit_passes_each_service_row_to_serve(option: serve_options.ServeOption) -> None:
    value = _sample(option)
    assert value != option.default
    spec = services.spec_for("serve", model="/models/m.gguf", bind="127.0.0.1", port=None, api_key=None,
                             serve={option.name: value})
    argv = services.exec_argv(spec, Layout("/opt/bmoe-edge"), "rpi5")
    assert argv[1] == "serve"
    assert _same(option, _parsed(argv[2:])[option.name], value), argv


@pytest.mark.parametrize("option", serve_options.reaching("board"), ids=lambda o: o.flag)
def test_serve_host_passes_each_board_row_to_the_boards_serve(option: serve_options.ServeOption) -> None:
    value = _sample(option)
    args = onboard.serve_args(overrides={}, options={option.name: value})
    assert _same(option, _parsed(["-m", "/models/m.gguf", *args])[option.name], value), args


def test_defaults_are_not_written_and_the_server_applies_the_same_row() -> None:
    defaults = {o.name: o.default for o in serve_options.reaching("board")}
    assert onboard.serve_args(overrides={}, options=defaults) == []
    parsed = _parsed(["-m", "/models/m.gguf"])
    for option in OPTIONS:
        assert parsed[option.name] in (option.default, None, ()), option.flag


def test_a_board_refuses_what_it_cannot_take() -> None:
    refused = [o for o in OPTIONS if o.board is Reach.REFUSED]
    assert refused
    for option in refused:
        message = serve_options.refused_there({option.name: _sample(option)}, "board")
        assert message and option.flag in message
    assert serve_options.refused_there({o.name: o.default for o in OPTIONS}, "board") is None
    with pytest.raises(BmoeError, match="not passed"):
        serve_options.as_flags({refused[0].name: _sample(refused[0])}, "board")


def test_the_access_rule_is_one_rule() -> None:
    # serve's own check and deploy's check before a unit is written agree, row for row
    from bmoe_edge.serve.server import check_auth

    for bind in ("127.0.0.1", "::1", "0.0.0.0", "192.168.1.20"):
        for key in (None, "k"):
            for no_auth in (False, True):
                rule = serve_options.needs_key(bind, key is not None, no_auth)
                try:
                    check_auth(bind, (key,) if key else (), no_auth)
                    server_refuses = False
                except BmoeError:
                    server_refuses = True
                try:
                    services.spec_for("serve", model="/m.gguf", bind=bind, port=None, api_key=key,
                                      no_auth=no_auth and key is None)
                    deploy_refuses = False
                except BmoeError:
                    deploy_refuses = True
                assert server_refuses == rule, (bind, key, no_auth)
                if not (no_auth and key):
                    assert deploy_refuses == rule, (bind, key, no_auth)


def test_a_key_file_is_read_one_way(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alpha\n\n  beta  \n")
    assert serve_options.read_api_keys(keys) == ("alpha", "beta")
    keys.write_text("  \n")
    with pytest.raises(BmoeError, match="holds no key"):
        serve_options.read_api_keys(keys)
    keys.write_bytes(b"\xff\xfe")
    with pytest.raises(BmoeError, match="not text"):
        serve_options.read_api_keys(keys)
    with pytest.raises(BmoeError, match="cannot read"):
        serve_options.read_api_keys(tmp_path / "missing")
