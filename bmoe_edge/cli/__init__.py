"""The `bmoe-edge` command line: a thin typer shell. Each command only parses its arguments and calls
one module of the stage it belongs to (engine, boards, fleet, proof, bench, serve)."""

from __future__ import annotations

import sys

import typer

from bmoe_edge.cli import bench, boards, engine, fleet, proof, rpc, serve  # noqa: F401 - they register the commands
from bmoe_edge.cli.common import app
from bmoe_edge.errors import BmoeError

__all__ = ["app", "run"]


def run() -> None:
    """Entry point: expected errors become one line on stderr and exit code 1."""
    try:
        app()
    except BmoeError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    run()
