"""Gates and generate on the board through its current release; the output streams back as it comes."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from bmoe_edge.boards import bundle
from bmoe_edge.engine import serve_options
from bmoe_edge.engine.settings import BY_NAME
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import channel
from bmoe_edge.fleet.commands import Board, env_argv
from bmoe_edge.fleet.install import gates_record, run_gates
from bmoe_edge.fleet.lock import board_lock
from bmoe_edge.fleet.remote import SshOptions
from bmoe_edge.fleet.scripts import HANGUP
from bmoe_edge.fleet.state import connect, current_release, read_state, release_env, write_state
from bmoe_edge.fleet.targets import Target


def engine_flags(overrides: Mapping[str, object]) -> list[str]:
    """The engine and sampling settings that were given, as the board's command-line flags (None = the
    profile's or the declared default)."""
    args: list[str] = []
    for key, value in overrides.items():
        if value is None:
            continue
        setting = BY_NAME.get(key)
        if setting is None or not setting.flags:
            raise BmoeError(f"engine option {key} cannot be passed to the board")
        args += setting.as_flag(value)
    return args


def generate_args(*, max_tokens: int, overrides: Mapping[str, object], as_json: bool, progress: bool,
                  csv_path: str | None) -> list[str]:
    """`bmoe-edge generate` options for the board: only what was given (None = the profile's default)."""
    args = ["-n", str(max_tokens), *engine_flags(overrides)]
    if as_json:
        args.append("--json")
    if progress:
        args.append("--progress")
    if csv_path:
        args += ["--csv", csv_path]
    return args


def board_generate(target: Target, model: str, prompt: str, args: Sequence[str], *, options: SshOptions,
                   board_name: str | None = None, install_dir: str | None = None,
                   out: Any = None, err: Any = None) -> int:
    """Run `generate` on the board through its current release, streaming its output back as it comes.

    Returns the board command's exit code (its own `error:` line has already been streamed to `err`).
    """
    board, layout = connect(target, options, board_name, install_dir)
    with board:
        _rid, rel, manifest = current_release(board, layout)
        if board_name and board_name != manifest.board:
            raise BmoeError(f"{board.label}: the deployed release is for board {manifest.board}, not {board_name}")
        # the prompt travels as a private file (any length, never on a command line or in `ps`)
        prompt_file = f"{board.request_dir()}/prompt-{channel.request_name()}"
        board.write_bytes(prompt_file, prompt.encode("utf-8", "surrogateescape"), 0o600, durable=False)
        try:
            result = run_release(board, rel, ["generate", "--board", manifest.board, "-m", model,
                                              "--prompt-file", prompt_file, *args],
                                 what="generate", out=out or sys.stdout, err=err or sys.stderr)
        finally:
            board.sh('rm -f -- "$1"', prompt_file, what="removing the prompt file", check=False, timeout=60)
        return int(result.exited)


def serve_args(*, overrides: Mapping[str, object], options: Mapping[str, object]) -> list[str]:
    """`bmoe-edge serve` options for the board: the engine settings and serve's own options that were given
    (serve_options' rows the board takes); sampling comes with each request."""
    return [*engine_flags(overrides), *serve_options.as_flags(options, "board")]


def board_serve(target: Target, model: str, args: Sequence[str], *, port: int, local_port: int,
                options: SshOptions, api_key: str | None = None, board_name: str | None = None,
                install_dir: str | None = None, say: Any = print, out: Any = None, err: Any = None) -> int:
    """`serve` on the board through its current release, bound to the board's loopback, and this
    machine's 127.0.0.1:local_port forwarded to it over the same SSH connection (fabric's local
    forwarding): the server never listens on the board's network. It stops with the connection
    (Ctrl-C here). An API key travels as a private file (never on a command line or in `ps`)."""
    board, layout = connect(target, options, board_name, install_dir)
    with board:
        _rid, rel, manifest = current_release(board, layout)
        if board_name and board_name != manifest.board:
            raise BmoeError(f"{board.label}: the deployed release is for board {manifest.board}, not {board_name}")
        extra: list[str] = []
        key_file = None
        if api_key:
            key_file = f"{board.request_dir()}/api-key-{channel.request_name()}"
            board.write_bytes(key_file, api_key.encode(), 0o600, durable=False)
            extra = ["--api-key-file", key_file]
        try:
            with board.conn.forward_local(local_port, remote_port=port, remote_host="127.0.0.1",
                                          local_host="127.0.0.1"):
                say(f"forwarding http://127.0.0.1:{local_port} to {board.label} 127.0.0.1:{port}")
                result = run_release(board, rel, ["serve", "--board", manifest.board, "-m", model, "--bind",
                                                  "127.0.0.1", "--port", str(port), *extra, *args],
                                     what="serve", out=out or sys.stdout, err=err or sys.stderr)
        finally:
            if key_file:
                board.sh('rm -f -- "$1"', key_file, what="removing the API key file", check=False, timeout=60)
        return int(result.exited)


def run_release(board: Board, rel: str, args: Sequence[str], *, what: str, timeout: float | None = None,
                out: Any = None, err: Any = None) -> Any:
    """`bmoe-edge ARGS…` through a release's launcher on the board (its profiles and fixtures), stopped
    when the connection goes away; returns fabric's Result (output captured, or streamed to `out`/`err`;
    never raises on the command's own exit code)."""
    return board.sh(HANGUP, *env_argv(release_env(rel), [f"{rel}/{bundle.LAUNCHER_SCRIPT}", *args]), what=what,
                    check=False,
                    timeout=timeout, out=out, err=err, hangup=True)


def _text_report(text: str) -> dict[str, Any] | None:
    m = re.search(r"^gates: (\d+) passed, (\d+) failed\s*$", text, re.M)
    if not m:
        return None
    cells = [{"passed": False, "error": line[5:].strip()} for line in text.splitlines() if line.startswith("FAIL ")]
    return {"passed": int(m[1]), "failed": int(m[2]), "cells": cells}


def board_gates(target: Target, *, options: SshOptions, full: bool = False, as_json: bool = False,
                board_name: str | None = None, install_dir: str | None = None, out: Any = None) -> tuple[int, str]:
    """Run the current release's gates on the board (quick matrix unless `full`) with its own fixtures.

    Text output streams back as the cells finish; with `as_json` the JSON report is returned whole.
    The result is recorded in the board's state.json (what `status` shows). Returns (exit code, stdout).
    """
    board, layout = connect(target, options, board_name, install_dir)
    with board:
        rid, rel, _manifest = current_release(board, layout)
        code, stdout, report = run_gates(board, rel, full=full, json_out=as_json,
                                      out=None if as_json else (out or sys.stdout))
        if not as_json:
            report = _text_report(stdout)
        if report is not None:
            record = gates_record(report, rid, quick=not full)
            if not as_json:
                record["failing"] = [c["error"] for c in report.get("cells", [])]
            with board_lock(board, layout.install_dir, action="recording gate results"):
                state = read_state(board, layout)      # read again under the lock: a deploy may have run
                history = state.get("releases") if isinstance(state.get("releases"), dict) else {}
                if isinstance(history.get(rid), dict) or state.get("bundle_id") == rid:
                    history.setdefault(rid, {})["gates"] = record
                    state["releases"] = history
                    if state.get("bundle_id") == rid:
                        state["gates"] = record
                    write_state(board, layout, state)
        elif code == 0:
            code = 1
        return code, stdout
