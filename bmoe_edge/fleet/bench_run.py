"""`bench stream|io|serve --host`: a benchmark run on the board by its current release, detached
there (a campaign takes hours; a lost connection must not stop it), its progress lines streamed here as they
come, and every file it wrote fetched into the local --out, so the directory looks like a local run's.

The local --out remembers the run on the board (RUN_MARKER) until its files are here: the same command again
with the same --out follows that run instead of starting another, and fetches it when it is done."""

from __future__ import annotations

import io
import json
import secrets
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bmoe_edge.boards import bundle
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.commands import STEP_TIMEOUT, Board, env_argv
from bmoe_edge.fleet.remote import SshOptions
from bmoe_edge.fleet.scripts import BENCH_FETCH, BENCH_FOLLOW, BENCH_START
from bmoe_edge.fleet.state import connect, current_release, release_env
from bmoe_edge.fleet.targets import Target

RUN_MARKER = ".bmoe-edge-board-run.json"   # in the local --out while its run on the board is not fetched
STOPPED, NO_RUN = 124, 125                 # bench_follow.sh: the run died without an exit code; no such run


@dataclass(frozen=True)
class BoardRun:
    """What a finished run left: the board command's exit code and its stdout (the summary it printed)."""

    exited: int
    stdout: str


def run_bench(target: Target, command: Sequence[str], models: Sequence[str], args: Sequence[str], out: Path | None,
              *, options: SshOptions, install_dir: str | None = None, progress: IO[str] | None = None) -> BoardRun:
    """`bmoe-edge bench COMMAND -m MODEL… ARGS… --out RUN/out` on the board through its current release,
    detached; its stderr streams to `progress` as it comes; then RUN/out is fetched into `out` (None: not
    fetched) and the run's directory on the board removed. With an unfetched run of this board recorded in
    `out`, that run is followed instead of a new one started."""
    progress = progress or sys.stderr
    board, layout = connect(target, options, None, install_dir)
    with board:
        marker = out / RUN_MARKER if out is not None else None
        run = _recorded_run(marker, board.label)
        if run is None:
            _rid, rel, _manifest = current_release(board, layout)
            for model in models:
                if board.sh('[ -f "$1" ] && [ -r "$1" ]', model, what="checking the model", check=False).exited != 0:
                    raise BmoeError(f"{board.label}: {model}: no such readable file on the board (-m is a path there)")
            model_args = [arg for model in models for arg in ("-m", model)]
            argv = env_argv(release_env(rel), [f"{rel}/{bundle.LAUNCHER_SCRIPT}", "bench", *command, *model_args,
                                               *args])
            run_id = time.strftime("%Y%m%dT%H%M%S-") + secrets.token_hex(4)
            run = board.sh(BENCH_START, run_id, *argv, what="starting the benchmark", timeout=60).stdout.strip()
            if marker is not None:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(json.dumps({"board": board.label, "run": run}) + "\n")
        else:
            progress.write(f"following the run already started on the board ({marker} records it)\n")
        code = _follow(board, run, out, progress)
        if out is not None:
            _fetch(board, run, out)
        stdout = board.sh('cat -- "$1/stdout" 2>/dev/null; rm -rf -- "$1"', run, what="cleaning up the run",
                          check=False).stdout
        if marker is not None:
            marker.unlink(missing_ok=True)
        if code == STOPPED:
            raise BmoeError(f"{board.label}: the benchmark on the board stopped without finishing (killed, or the "
                            "board restarted)" + (f"; what it wrote is in {out}" if out is not None else ""))
        return BoardRun(code, stdout)


def _recorded_run(marker: Path | None, label: str) -> str | None:
    """The board run recorded in the local --out, if it is this board's; another board's is an error."""
    if marker is None or not marker.is_file():
        return None
    try:
        recorded = json.loads(marker.read_text())
        board, run = str(recorded["board"]), str(recorded["run"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BmoeError(f"{marker}: not a record of a board run ({exc}): delete it to start a new run") from None
    if board != label:
        raise BmoeError(f"{marker.parent} holds an unfetched run of {board}: follow it with --host {board}, or "
                        "use another --out")
    return run


def _follow(board: Board, run: str, out: Path | None, progress: IO[str]) -> int:
    """The run's log streamed to `progress` from its start until it ends; its exit code. A lost connection
    (or Ctrl-C) leaves the run going on the board: one line saying how to pick it up again."""
    again = f"run the same command again{f' with --out {out}' if out is not None else ''} to follow it and " \
            "fetch its results"
    try:
        result = board.sh(BENCH_FOLLOW, run, "0", what="following the benchmark", check=False, timeout=None,
                          out=progress)
    except BmoeError as exc:
        raise BmoeError(f"the connection was lost ({exc}); the benchmark goes on on the board: {again}") from None
    except KeyboardInterrupt:
        raise BmoeError(f"interrupted here; the benchmark goes on on the board: {again}") from None
    if result.exited == NO_RUN:
        raise BmoeError(f"{board.label}: the run {run} is gone from the board"
                        + (f" (delete {out / RUN_MARKER} to start a new one)" if out is not None else ""))
    return int(result.exited)


def _fetch(board: Board, run: str, out: Path) -> None:
    """The run's out/ directory, as one tar stream, into `out` (the archive's members only: tarfile's
    `data` filter refuses links and paths outside `out`)."""
    result = board.sh(BENCH_FETCH, run, what="fetching the results", check=False, timeout=STEP_TIMEOUT)
    if result.exited == 3:
        return          # the run failed before writing anything (its error line was streamed)
    if result.exited != 0:
        raise BmoeError(f"{board.label}: fetching the results of {run} failed (exit {result.exited})")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(result.raw), mode="r:") as tar:
        tar.extractall(out, filter="data")
