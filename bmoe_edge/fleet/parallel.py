"""Running a fleet command over many hosts in parallel: one failing host never stops the others."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.remote import Watch, watched
from bmoe_edge.fleet.report import HostResult, strip_host
from bmoe_edge.fleet.targets import Target

HOST_TIMEOUT = 4 * 3600.0     # a host still at work after this is cut off (--host-timeout)


def run_fleet(targets: Sequence[Target], work: Callable[[Target], HostResult], *, max_parallel: int | None = None,
              fail_fast: bool = False, host_timeout: float | None = HOST_TIMEOUT,
              what: str = "deploy") -> list[HostResult]:
    """`work` for every target on a pool of `max_parallel` threads (default: all, up to 16).

    Every host is one row: a BmoeError (or a bug) is that host's failure, never the others'. A host
    still at work `host_timeout` seconds after it started has its SSH connections closed (whatever it
    waits on fails at once) and is reported as past its deadline. With `fail_fast` hosts not started
    when one fails are skipped."""
    stop = threading.Event()

    def one(target: Target, watch: Watch, started: list[float]) -> HostResult:
        started.append(time.monotonic())
        if stop.is_set():
            return HostResult(host=target.label, board=target.board, action=what,
                              error=f"{target.label}: skipped: another host failed first (--fail-fast)")
        try:
            with watched(watch):
                result = work(target)
        except BmoeError as exc:
            result = HostResult(host=target.label, board=target.board, error=str(exc), action=what)
        except Exception as exc:   # a bug must not take the other hosts down; report it
            result = HostResult(host=target.label, board=target.board, action=what,
                                error=f"{target.label}: unexpected {type(exc).__name__}: {exc}")
        if watch.expired and not result.ok:
            result.error = (f"{target.label}: no result within the host deadline of {host_timeout:.0f} s "
                            f"(--host-timeout); the connection was closed ({strip_host(result)})")
        result.seconds = result.seconds or time.monotonic() - started[0]
        if not result.ok and fail_fast:
            stop.set()
        return result

    watches = [Watch() for _ in targets]
    starts: list[list[float]] = [[] for _ in targets]
    workers = max(1, min(len(targets), max_parallel or 16))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, t, w, st) for t, w, st in zip(targets, watches, starts, strict=True)]
        pending = set(futures)
        try:
            while pending:
                _done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                if host_timeout is None:
                    continue
                now = time.monotonic()
                for f, w, st in zip(futures, watches, starts, strict=True):
                    if f in pending and st and not w.expired and now - st[0] > host_timeout:
                        w.expire()
        except BaseException:     # Ctrl-C: every connection closed, so the workers end at once
            stop.set()
            for w in watches:
                w.expire()
            raise
        return [f.result() for f in futures]
