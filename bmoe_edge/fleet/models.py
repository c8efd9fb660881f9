"""`bmoe-edge push-model`: a model (and its split shards) onto boards, resumably, verified, swapped in by
rename.

Per file: the bytes go to `<dest>.bmoe-part` beside the destination (appended to what an interrupted
push left there, once the start of it hashes like the local file's start), the whole partial is hashed
on the board and must equal the local sha256, then it is renamed over the destination. A generation
running on the board keeps the old file it has open and finishes with it; the next one opens the new
file. A file already there with the right sha256 is not sent again. Each file is pushed holding the
board lock of its destination directory (lock.py): two pushes to one place take turns.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import channel
from bmoe_edge.fleet.commands import MIN_RATE, STEP_TIMEOUT, Board, tail
from bmoe_edge.fleet.lock import LOCK_TIMEOUT, board_lock
from bmoe_edge.fleet.parallel import run_fleet
from bmoe_edge.fleet.remote import SshOptions
from bmoe_edge.fleet.report import HostResult, Log, say, stderr_log
from bmoe_edge.fleet.scripts import MODEL_APPEND, MODEL_COMMIT, MODEL_PART
from bmoe_edge.fleet.state import connect
from bmoe_edge.fleet.targets import Target
from bmoe_edge.units import size_text

_SHARD = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")
PART = ".bmoe-part"
MODELS_DIR = "models"


@dataclass(frozen=True)
class ModelFile:
    path: Path
    size: int
    sha256: str


def model_files(first: Path) -> list[Path]:
    """The file, or every shard of a split model (`name-00001-of-0000N.gguf` given: all N, checked)."""
    first = Path(first)
    if not first.is_file():
        raise BmoeError(f"model {first} does not exist")
    m = _SHARD.match(first.name)
    if not m:
        return [first]
    n = int(m["n"])
    files = [first.with_name(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise BmoeError(f"model {first}: shard {missing[0]} is missing (a split model travels whole)")
    return files


def _sha256(path: Path, limit: int | None = None) -> str:
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            block = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def destination(to: str | None, install_dir: str, name: str) -> str:
    """`--to` a directory (ending in /) or a file path; default `<install_dir>/models/<name>`."""
    if not to:
        return f"{install_dir}/{MODELS_DIR}/{name}"
    if not to.startswith("/") or "\0" in to or "\n" in to:
        raise BmoeError(f"--to {to!r} must be an absolute path on the board")
    return posixpath.join(to, name) if to.endswith("/") else to


def push_file(board: Board, f: ModelFile, dest: str, result: HostResult, log: Log) -> None:
    part = dest + PART
    n_check = 0
    probe = board.sh(MODEL_PART, dest, part, "0", what=f"looking at {dest}", check=False)
    if probe.exited == 10:
        raise BmoeError(f"{board.label}: cannot create the directory of {dest}: {tail(probe.stderr)}")
    if probe.exited == 11:
        raise BmoeError(f"{board.label}: {dest} is a directory on the board: end --to with / to push into it")
    if probe.exited != 0:
        raise BmoeError(f"{board.label}: looking at {dest} failed (exit {probe.exited}): {tail(probe.stderr)}")
    facts = dict(line.split(" ", 1) for line in probe.stdout.splitlines() if " " in line)
    if facts.get("dest") == f.sha256:
        say(log, board.label, f"{posixpath.basename(dest)} is already there (sha256 matches)")
        return
    have = int(facts.get("part", "0 -").split()[0] or 0)
    if 0 < have <= f.size:     # resume only when what is there is the start of this file
        n_check = have
        again = board.sh(MODEL_PART, dest, part, str(n_check), what=f"checking {part}")
        got = dict(line.split(" ", 1) for line in again.stdout.splitlines() if " " in line)["part"].split()
        if got[1] != _sha256(f.path, n_check):
            n_check = 0
    rest = f.size - n_check
    say(log, board.label, f"{posixpath.basename(dest)}: sending {size_text(rest)}"
         + (f" (resuming after {size_text(n_check)})" if n_check else ""))
    board.sh(MODEL_APPEND, part, str(n_check), what=f"uploading {posixpath.basename(dest)}",
             data=channel.FileFrom(f.path, n_check), timeout=STEP_TIMEOUT + rest / MIN_RATE)
    result.files_uploaded += 1
    result.bytes_uploaded += rest
    check = board.sh(MODEL_COMMIT, part, dest, f.sha256, what=f"verifying {dest}", check=False,
                     timeout=STEP_TIMEOUT + f.size / (20 * MIN_RATE))
    if check.exited != 0:
        raise BmoeError(f"{board.label}: {dest} did not arrive intact ({tail(check.stderr)}): run it again")
    say(log, board.label, f"{dest}: sha256 verified, in place")


def push_host(files: Sequence[ModelFile], target: Target, *, options: SshOptions, to: str | None,
              board_name: str | None, install_dir: str | None, log: Log,
              lock_timeout: float = LOCK_TIMEOUT) -> HostResult:
    started = time.monotonic()
    # with --to the install dir is not needed (a board with no deploy yet takes a model too)
    board, layout = connect(target, options, board_name, install_dir or ("/" if to else None))
    with board:
        result = HostResult(host=board.label, action="pushed", install_dir=None if to else layout.install_dir,
                            files=len(files))
        if to and len(files) > 1 and not to.endswith("/"):
            raise BmoeError(f"--to {to}: a split model needs a directory (end it with /)")
        dests = [destination(to, layout.install_dir, f.path.name) for f in files]
        for f, dest in zip(files, dests, strict=True):
            # one push per destination directory at a time: two pushes appending to one part file would
            # leave bytes after a model the first one just reported verified
            with board_lock(board, posixpath.dirname(dest), action=f"push-model of {f.path.name}",
                            wait=lock_timeout, say=lambda text: say(log, board.label, text)):
                push_file(board, f, dest, result, log)
        result.releases = dests
    result.ok = True
    result.seconds = time.monotonic() - started
    return result


def push_model(model: Path, hosts: Sequence[Target], *, options: SshOptions, to: str | None = None,
               board_name: str | None = None, install_dir: str | None = None, log: Log | None = None,
               max_parallel: int | None = None, lock_timeout: float = LOCK_TIMEOUT) -> list[HostResult]:
    log = log or stderr_log()
    files = [ModelFile(p, p.stat().st_size, _sha256(p)) for p in model_files(model)]
    return run_fleet(hosts, lambda t: push_host(files, t, options=options, to=to, board_name=board_name,
                                                install_dir=install_dir, log=log, lock_timeout=lock_timeout),
                     max_parallel=max_parallel, what="push-model")
