"""The prompt cache on a board's disk (issue #44, finding 6): within a byte budget (by default a fraction of
its filesystem), each API key within its share, never filling the filesystem, written off the engine
thread's path, a failed store a warning and never a failed request, and by default in the service's state
directory (private), not /tmp. Real filesystems: small tmpfs mounts and a loop-mounted ext4 frozen with
fsfreeze (root only: skipped elsewhere, with the reason)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bmoe_edge.engine import prompt_cache
from bmoe_edge.engine.session import Engine, Sampling
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.errors import BmoeError
from bmoe_edge.serve.worker import ENGINE_FAILURES
from bmoe_edge.synthetic import tinymoe

from test_prompt import LONG
from test_serve import Server, http, post, start, stop

KEYS = ("tenant-a-5c1e", "tenant-b-93d0")


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


def story(i: int) -> str:
    """A long prompt (~600 tokens) of its own: no two share a prefix the cache would use."""
    return f"Story {i}. {LONG}"


def _mount(*argv: str) -> None:
    result = subprocess.run(["mount", *argv], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount here (root and mount(8) needed): {result.stderr.strip()}")


@contextlib.contextmanager
def tmpfs(where: Path, size_kib: int) -> Iterator[Path]:
    """A real filesystem of `size_kib` KiB (a tmpfs), unmounted after."""
    where.mkdir()
    _mount("-t", "tmpfs", "-o", f"size={size_kib}k,mode=0700", "tmpfs", str(where))
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(fs: Path, leave: int) -> None:
    """Take all of `fs` but `leave` bytes."""
    st = os.statvfs(fs)
    with open(fs / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - leave)


def disk_bytes(directory: Path) -> int:
    total = 0
    for p in directory.iterdir():
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_size
    return total


def complete(server: Server, prompt: str, key: str | None = None) -> dict:
    r = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0}, key=key)
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(condition, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_many_distinct_long_prompts_never_take_more_than_the_budget(model: Path, tmp_path: Path) -> None:
    """Without --prompt-cache-mb the budget is the default rule's (the smaller of 1 GiB and 5% of the
    filesystem): on a 16 MiB filesystem ~820 KiB, two states of the tiny model. Sampled all along (a store
    evicts before it writes), the directory never holds more, however many distinct prompts come."""
    with tmpfs(tmp_path / "fs", 16 << 10) as fs:
        cache = fs / "prompts"
        budget = prompt_cache.Budget().total_bytes(fs)
        assert budget == int(prompt_cache.DEFAULT_FRACTION * os.statvfs(fs).f_blocks * os.statvfs(fs).f_frsize)
        server = start(model, "--no-auth", "--prompt-cache", str(cache))
        most, done = 0, threading.Event()

        def sample() -> None:
            nonlocal most
            while not done.is_set():
                most = max(most, disk_bytes(cache))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            for i in range(8):
                complete(server, story(i))
                wait_for(lambda i=i: any(p.name.endswith(".state") for p in cache.iterdir()), "nothing was kept")
            time.sleep(0.5)   # the last store's write
        finally:
            done.set()
            sampler.join()
            stop(server)
        assert 0 < most <= budget, (most, budget)
        assert 1 <= len(list(cache.glob("*.state"))) <= 2
        assert "Traceback" not in server.stderr


@pytest.mark.parametrize("trouble", ["nearly full", "read-only"])
def test_a_filesystem_that_cannot_take_a_state_is_a_warning_and_the_answers_are_right(
        model: Path, tmp_path: Path, trouble: str) -> None:
    """A nearly full filesystem (100 KiB left: statvfs refuses before any byte is written) or a read-only one
    (EROFS from the write itself): every answer is 200 and the greedy answer of a plain run, one warning line,
    /health ok after more stores than the engine failures that end a server (serve/worker.ENGINE_FAILURES)."""
    with tmpfs(tmp_path / "fs", 16 << 10) as fs:
        cache = fs / "prompts"
        server = start(model, "--no-auth", "--prompt-cache", str(cache))
        try:
            if trouble == "nearly full":
                fill(fs, 100 << 10)
            else:
                _mount("-o", "remount,ro", str(fs))
            answers = [complete(server, story(i))["choices"][0]["text"] for i in range(ENGINE_FAILURES + 2)]
            time.sleep(0.5)   # the last store's attempt
            health = http(server.url, "GET", "/health")
            assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        finally:
            stop(server)
        with Engine(model, StreamConfig(threads=1)) as plain:
            assert answers == [plain.run(story(i), 4, Sampling(temp=0.0)).text for i in range(ENGINE_FAILURES + 2)]
        warnings = [line for line in server.stderr.splitlines() if "prompt cache" in line]
        assert len(warnings) == 1 and warnings[0].startswith("warning: "), server.stderr
        assert ("free" if trouble == "nearly full" else "EROFS") in warnings[0]
        assert not list(cache.glob("*.state*")) and "Traceback" not in server.stderr


def test_one_tenant_s_prompts_do_not_evict_another_s_entries(model: Path, tmp_path: Path) -> None:
    """Two keys share --prompt-cache-mb 2 equally (1 MiB each: three states of the tiny model). Tenant B's
    seventeen distinct prompts (more than a tenant's 16 entries too) evict only B's own; A's prompt, decoded
    first, still comes back from the cache after B's."""
    cache, key_file = tmp_path / "prompts", tmp_path / "keys"
    key_file.write_text("\n".join(KEYS))
    a, b = KEYS
    server = start(model, "--api-key-file", str(key_file), "--prompt-cache", str(cache), "--prompt-cache-mb", "2")
    try:
        complete(server, story(0), key=a)
        wait_for(lambda: len(list(cache.glob("*-0.state"))) == 1, "tenant A's prompt was not kept")
        for i in range(1, 18):
            asked = time.time_ns()
            complete(server, story(i), key=b)
            wait_for(lambda asked=asked: any(p.stat().st_mtime_ns >= asked for p in cache.glob("*-1.state")),
                     "tenant B's prompt was not kept")
            held_by_b = sum(p.stat().st_size for p in cache.glob("*-1.state*"))
            assert held_by_b <= 1 << 20
        assert len(list(cache.glob("*-0.state"))) == 1   # A's entry is still there
        again = complete(server, story(0) + " And then?", key=a)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 256   # restored from it
    finally:
        stop(server)
    assert disk_bytes(cache) <= 2 << 20


def test_the_answer_does_not_wait_for_the_disk(model: Path, tmp_path: Path) -> None:
    """The cache on an ext4 frozen with fsfreeze: every write to it blocks until it thaws. Two long prompts are
    answered meanwhile (the engine thread took the first state into memory; the second finds the writer busy
    and is not kept), and the first entry lands once the filesystem thaws."""
    image, mnt = tmp_path / "fs.img", tmp_path / "fs"
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    mnt.mkdir()
    _mount("-o", "loop", str(image), str(mnt))
    frozen = False
    server = None
    try:
        cache = mnt / "prompts"
        server = start(model, "--no-auth", "--prompt-cache", str(cache))
        subprocess.run(["fsfreeze", "-f", str(mnt)], check=True)
        frozen = True
        first, second = (http(server.url, "POST", "/v1/completions", json.dumps(
            {"prompt": story(i), "max_tokens": 4, "temperature": 0}).encode(),
            {"Content-Type": "application/json"}, timeout=30) for i in range(2))   # a timeout: the answer waited
        assert first.status_code == second.status_code == 200, (first.text, second.text)
        assert not list(cache.glob("*.state"))   # nothing on disk yet: the write waits for the thaw
        subprocess.run(["fsfreeze", "-u", str(mnt)], check=True)
        frozen = False
        wait_for(lambda: len(list(cache.glob("*.state"))) == 1, "the state was not written after the thaw")
    finally:
        if frozen:
            subprocess.run(["fsfreeze", "-u", str(mnt)], check=False)
        if server is not None:
            stop(server)
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_the_default_directory_is_the_service_s_state_directory_private_and_a_dead_process_s_goes(
        model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve's cache without --prompt-cache: a directory of the process under $STATE_DIRECTORY (systemd's
    StateDirectory=), 0700, never /tmp; a run directory a killed process left is removed at the next start,
    and the process's own goes when it closes."""
    state = tmp_path / "state"
    monkeypatch.setenv("STATE_DIRECTORY", f"{state}:{tmp_path / 'other'}")
    left = state / "prompt-cache" / "run-killed"
    left.mkdir(parents=True)
    (left / "a.state").write_bytes(b"x" * 4096)
    with Engine(model, StreamConfig(threads=1), prompt_cache_kind="dir") as engine:
        cache = engine.prompt_cache
        assert cache is not None and cache.path.parent == state / "prompt-cache"
        assert stat.S_IMODE(cache.path.stat().st_mode) == 0o700
        assert stat.S_IMODE(cache.path.parent.stat().st_mode) == 0o700
        assert not left.exists()
        engine.run(story(0), 2)
        assert cache.flush(10) and len(list(cache.path.glob("*.state"))) == 1
        own = cache.path
    assert not own.exists()
    with Engine(model, StreamConfig(threads=1), prompt_cache_kind="dir",
                prompt_cache_budget=prompt_cache.Budget(mb=0)) as off:
        assert off.prompt_cache is None   # --prompt-cache-mb 0


def test_a_directory_another_process_uses_or_one_that_cannot_be_made_is_one_clear_refusal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes in one --prompt-cache DIR would each keep their own budget there (twice the bytes): the
    second is refused while the first holds it. A state directory that cannot be made is one line too."""
    first = prompt_cache.PromptCache(tmp_path / "prompts", "me")
    try:
        with pytest.raises(BmoeError, match="another bmoe-edge process uses it"):
            prompt_cache.PromptCache(tmp_path / "prompts", "me")
    finally:
        first.close()
    prompt_cache.PromptCache(tmp_path / "prompts", "me").close()   # free again once the first is closed
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "not-a-dir"))
    with pytest.raises(BmoeError, match=r"the prompt cache cannot use .*not-a-dir"):
        prompt_cache.PromptCache(None, "me")


def test_a_stopped_server_s_directory_goes_by_the_next_start_at_the_latest(model: Path, tmp_path: Path) -> None:
    """uvicorn re-raises the SIGTERM it caught once it has shut down, so a stopped serve may never run its
    cleanup (today's /tmp directories piled up, one per stop): the next start removes what it left, so a
    restart loop keeps one directory, not one per restart."""
    state = tmp_path / "state"
    env = {"STATE_DIRECTORY": str(state)}
    for _ in range(3):
        server = start(model, "--no-auth", env=env)
        try:
            complete(server, story(0))
            runs = list((state / "prompt-cache").glob("run-*"))
            assert len(runs) == 1, runs
            wait_for(lambda runs=runs: len(list(runs[0].glob("*.state"))) == 1, "the prompt was not kept")
        finally:
            stop(server)
    assert len(list((state / "prompt-cache").glob("run-*"))) <= 1


def test_a_state_larger_than_a_tenant_s_share_is_never_written(model: Path, tmp_path: Path) -> None:
    """1 MiB shared by four keys: 256 KiB each, less than one state of the tiny model (~310 KiB). Nothing is
    written, one warning says why; the next prompt's state is not even copied (estimated from the first)."""
    lines: list[str] = []
    with Engine(model, StreamConfig(threads=1)) as engine:
        engine.prompt_cache = prompt_cache.PromptCache(tmp_path / "prompts", "me", warn=lines.append,
                                                       budget=prompt_cache.Budget(mb=1, tenants=4))
        answers = [engine.run(story(i), 3, Sampling(temp=0.0)).text for i in range(3)]
        assert engine.prompt_cache.flush(10)
        with Engine(model, StreamConfig(threads=1)) as plain:
            assert answers == [plain.run(story(i), 3, Sampling(temp=0.0)).text for i in range(3)]
    assert not list((tmp_path / "prompts").glob("*.state*"))
    assert len(lines) == 1 and "larger than a tenant's share" in lines[0] and "0.2 MiB of 1.0 MiB" in lines[0]
