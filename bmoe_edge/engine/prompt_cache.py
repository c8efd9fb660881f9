"""The prompt cache: the keys and values of long prompts kept in llama.cpp state files, restored when a later
prompt starts the same way (a system prompt and tools every conversation of a client begins with).

An entry is a state file (`Engine.save_state`: the context's KV cells and their tokens) and beside it a small
JSON record: the model's identity, the tokens' count and digest, and a scope (serve's tenant: one client's
prompts never warm another's). An entry is used only where its identity is this engine's; a directory or file
written for another model or other settings is refused with one line (BmoeError), never loaded: a state file
of a model with the same shapes would load and answer wrongly.

`serve`/`chat` keep one entry per long prompt in a directory (`--prompt-cache DIR`, else a private directory of
the process under the service's state directory, removed at exit); `generate --prompt-cache FILE` keeps one, in
that file.

The disk is the board's: entries live within a byte budget (`Budget`: `serve --prompt-cache-mb`, by default
`default_budget_bytes`), each tenant within its share of it (its own stores evict its own entries, least
recently used first, never another's), and a state is written only where the filesystem keeps its reserve
free after it (`RESERVE_FRACTION`, checked with statvfs). A store takes the state into memory on the engine
thread (a memfd: a copy, no disk) and writes it on a thread of its own, so an answer never waits for the disk;
a store that fails (a full or read-only filesystem, an I/O error) is a warning, said once per cause, and the
answer goes on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bmoe_edge.engine import memlimits
from bmoe_edge.errors import BmoeError
from bmoe_edge.units import MiB

__all__ = ["MIN_TOKENS", "Budget", "PromptCache", "common_prefix", "default_budget_bytes", "model_identity",
           "state_root"]

FORMAT = "bmoe-prompt-cache/1"
MIN_TOKENS = 256      # shorter prefixes decode in a moment: not worth a state file
MAX_ENTRIES = 16      # per tenant: each lookup compares the prompt with every entry's tokens
_SAMPLES = 16         # stretches of the model file hashed for its identity, besides its head
_SAMPLE_BYTES = 1 << 16
_HEAD_BYTES = 4 << 20  # the gguf header (metadata, tensor table) of any model this runs fits in it

# The default budget: the smaller of a fixed cap and a fraction of the cache's filesystem (a board's root
# filesystem is its SD card or eMMC: 1 GiB holds five 2048-token prompts of Qwen3-30B-A3B at ~96 KiB a token).
DEFAULT_CAP_BYTES = 1 << 30
DEFAULT_FRACTION = 0.05
# A state is written only where the filesystem keeps this fraction of its size free after it (the system's
# logs and updates need room; ext4's root reserve is not the service's to count on).
RESERVE_FRACTION = 0.10
# A state waits in memory (a memfd, counted as the process's) until it is written: one larger than this
# fraction of the memory available (`_memory_available`) is not taken; the expert cache sized itself to the
# memory there was.
MEMORY_FRACTION = 0.25
CLOSE_WAIT_S = 30.0   # close waits this long for a state still being written (a hung disk: then it goes)
_COPY_CHUNK = 1 << 20

# Settings that change the keys and values a prompt leaves (everything else is bit-identical by the gates).
KV_SETTINGS = ("n_expert_used", "drop_cold", "flash_attn")


class StateEngine(Protocol):
    config: object

    @property
    def context_tokens(self) -> list[int]: ...
    def save_state(self, path: str | Path) -> None: ...
    def load_state(self, path: str | Path) -> None: ...


@dataclass(frozen=True)
class Budget:
    """The bytes the cache may take on disk (None: `default_budget_bytes` of its filesystem; 0: no cache) and
    how many tenants share them (serve: its API keys), each holding at most an equal share."""

    mb: int | None = None
    tenants: int = 1

    @property
    def off(self) -> bool:
        return self.mb == 0

    def total_bytes(self, directory: Path) -> int:
        return default_budget_bytes(directory) if self.mb is None else self.mb << 20

    def share_bytes(self, directory: Path) -> int:
        return self.total_bytes(directory) // max(1, self.tenants)


def default_budget_bytes(directory: Path) -> int:
    """The budget of a cache in `directory` when none is given (the rule is DEFAULT_CAP_BYTES and
    DEFAULT_FRACTION, declared once above)."""
    fs = os.statvfs(directory)
    return min(DEFAULT_CAP_BYTES, int(DEFAULT_FRACTION * fs.f_blocks * fs.f_frsize))


def state_root() -> Path:
    """Where a cache lives when no --prompt-cache names one: under systemd's StateDirectory= ($STATE_DIRECTORY,
    its first path) where the service manager sets one, else the user's cache directory (the deployed unit
    points $XDG_CACHE_HOME into the service's own directory). Never /tmp: on a board that is the root
    filesystem too, and a private /tmp would hide what it takes."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return Path(state) / "prompt-cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bmoe-edge" / "prompt-cache"


def model_identity(model: Path, config: object, llama_commit: str) -> str:
    """A digest of the model file (its size, its first 4 MiB: the header with every key and tensor, and 16
    stretches of its data), the settings that change a prompt's keys and values, and the llama.cpp commit
    (the state format)."""
    digest = hashlib.sha256()
    size = model.stat().st_size
    digest.update(f"{size}\0{llama_commit}\0".encode())
    digest.update(json.dumps({name: getattr(config, name, None) for name in KV_SETTINGS}, sort_keys=True).encode())
    with open(model, "rb") as f:
        digest.update(f.read(_HEAD_BYTES))
        for i in range(_SAMPLES):
            f.seek(size * i // _SAMPLES)
            digest.update(f.read(_SAMPLE_BYTES))
    return digest.hexdigest()


def _tokens_digest(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _memory_available() -> int | None:
    """The memory a copy may take: the kernel's MemAvailable, or less where a cgroup limits this process (the
    deployed unit's MemoryMax): that limit less what the process holds (its resident set). None: unknown."""
    available = None
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    limit = memlimits.tightest_limit()
    if limit is not None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            resident = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            room = max(0, limit.mb * MiB - resident)
            available = room if available is None else min(available, room)
    return available


def _stderr_warning(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


# -- the directory and its lock ------------------------------------------------------------------------------

LOCK_NAME = ".lock"   # flock'd through a read-only descriptor: a lock keeps no file open for writing (remount ro)


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding an exclusive flock on `path` (created), or None when another process holds it."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _in_use(run: Path) -> bool:
    """Whether the process that made the run directory `run` still holds its lock."""
    try:
        fd = os.open(run / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False   # no lock in it: its process was killed before it took one
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _private_run_dir(root: Path) -> tuple[Path, int]:
    """A directory of this process's own under `root` (0700) and the lock it holds on it while it lives. Run
    directories whose process is gone (killed before it removed its own) are removed first, so a crash loop
    leaves no more than one budget behind. Under `root`'s lock: a process starting beside this one cannot take
    a directory between its creation and its lock."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(OSError):
        os.chmod(root, 0o700)
    with _locked(root / LOCK_NAME):
        for run in root.glob("run-*"):
            if run.is_dir() and not _in_use(run):
                shutil.rmtree(run, ignore_errors=True)
        path = Path(tempfile.mkdtemp(prefix="run-", dir=root))
        fd = _try_lock(path / LOCK_NAME)
    assert fd is not None   # a directory made a moment ago, under root's lock
    return path, fd


@dataclass
class _Entry:
    state: Path
    tokens: list[int]
    scope: int
    bytes: int   # the state file and its record


@dataclass
class _Snapshot:
    """A state taken into memory on the engine thread, for the writer thread to put on disk."""

    fd: int        # a memfd holding the state file's bytes
    size: int
    tokens: list[int]
    scope: int


class _NoRoom(Exception):
    """A state not written: the cause (a key for saying it once) and the line that says why."""

    def __init__(self, cause: str, line: str) -> None:
        super().__init__(line)
        self.cause = cause


class PromptCache:
    """Entries in `path`: a directory (`single=False`) or one file (`single=True`). `path=None`: a private
    directory of this process under `state_root()`, removed by `close`."""

    def __init__(self, path: Path | None, identity: str, *, single: bool = False, min_tokens: int = MIN_TOKENS,
                 max_entries: int = MAX_ENTRIES, budget: Budget | None = None,
                 warn: Callable[[str], None] = _stderr_warning) -> None:
        self.identity = identity
        self.single = single
        self.min_tokens = min_tokens
        self.max_entries = 1 if single else max_entries
        self.budget = budget or Budget()
        self._warn_line = warn
        self._warned: set[str] = set()
        self._lock_fd: int | None = None
        self._temporary = False
        self.restored_tokens = 0  # of the last restore
        self._entries: list[_Entry] = []  # most recently used last
        self._entries_lock = threading.Lock()   # the engine thread reads them, the writer thread changes them
        self._writing: threading.Thread | None = None
        self._bytes_per_token = 0.0   # of the last state taken: a larger one is not taken into memory at all
        self.path = path or state_root()
        try:
            if path is None:
                self.path, self._lock_fd = _private_run_dir(self.path)
                self._temporary = True
            self._load()
            directory = self.path.parent if single else self.path
            self.total_bytes = self.budget.total_bytes(directory)
            self.share_bytes = self.budget.share_bytes(directory)
        except OSError as exc:   # a directory this user cannot make or read: one line, before anything is served
            self.close()
            raise BmoeError(f"the prompt cache cannot use {self.path}: {exc.strerror or exc}; give --prompt-cache "
                            "another directory (or serve --prompt-cache-mb 0 for none)") from None
        except BaseException:
            self.close()
            raise
        for scope in {e.scope for e in self._entries}:   # a budget smaller than the last run's
            for victim in self._victims(scope, 0):
                with contextlib.suppress(OSError):   # read-only: counted still, the next store tries again
                    self._drop(victim)

    def close(self) -> None:
        """Wait (up to CLOSE_WAIT_S) for a state still being written; a private directory goes."""
        self.flush(CLOSE_WAIT_S)
        if self._temporary:
            shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the state being written, if any; True when none is left."""
        writing = self._writing
        if writing is not None:
            writing.join(timeout)
        return writing is None or not writing.is_alive()

    @property
    def disk_bytes(self) -> int:
        """What the entries take on disk (the state files and their records)."""
        with self._entries_lock:
            return sum(e.bytes for e in self._entries)

    # -- entries on disk ---------------------------------------------------------------------------------

    def _record_path(self, state: Path) -> Path:
        return state.with_name(state.name + ".json")

    def _load(self) -> None:
        if self.single:
            if self.path.is_dir():
                raise BmoeError(f"--prompt-cache {self.path}: a directory; generate keeps its prompt in a file")
            states = [self.path] if self.path.exists() else []
        else:
            if self.path.exists() and not self.path.is_dir():
                raise BmoeError(f"--prompt-cache {self.path}: not a directory (serve and chat keep a directory)")
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
            if self._lock_fd is None:
                self._lock_fd = _try_lock(self.path / LOCK_NAME)
                if self._lock_fd is None:   # two processes' budgets in one directory would add up
                    raise BmoeError(f"--prompt-cache {self.path}: another bmoe-edge process uses it; give each "
                                    "its own directory")
            # A write a killed process left, a record whose state a failed eviction deleted: no entry's bytes
            leftovers = [*self.path.glob("*.partial"), *(r for r in self.path.glob("*.state.json")
                                                         if not r.with_suffix("").exists())]
            for leftover in leftovers:
                with contextlib.suppress(OSError):
                    leftover.unlink()
            states = sorted(self.path.glob("*.state"), key=lambda p: p.stat().st_mtime)
        for state in states:
            record = self._read_record(state)
            if record["identity"] != self.identity:
                raise BmoeError(f"--prompt-cache {self.path}: written for another model or other settings "
                                f"({state.name}); it is not used: give another path or delete it")
            try:
                tokens = [int(t) for t in record["tokens"]]  # type: ignore[attr-defined]
                scope = int(record.get("scope", 0))  # type: ignore[arg-type]
                intact = _tokens_digest(tokens) == record["digest"]
            except (KeyError, TypeError, ValueError):
                intact = False
            if not intact:
                raise BmoeError(f"--prompt-cache {state}: its record does not match its tokens (damaged); delete it")
            size = state.stat().st_size + self._record_path(state).stat().st_size
            self._entries.append(_Entry(state, tokens, scope, size))

    def _read_record(self, state: Path) -> dict[str, object]:
        try:
            record = json.loads(self._record_path(state).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise BmoeError(f"--prompt-cache {state}: no prompt-cache record beside it ({self._record_path(state).name}"
                            "): not a bmoe-edge prompt cache, not used; give another path or delete it") from None
        if not isinstance(record, dict) or record.get("format") != FORMAT or "identity" not in record:
            raise BmoeError(f"--prompt-cache {state}: not a {FORMAT} record; give another path or delete it")
        return record

    # -- use ---------------------------------------------------------------------------------------------

    def best(self, prompt: list[int], scope: int = 0) -> tuple[_Entry | None, int]:
        """The entry sharing the longest prefix with `prompt` (at least min_tokens), and that length."""
        best, length = None, 0
        with self._entries_lock:
            entries = list(self._entries)
        for entry in entries:
            n = common_prefix(entry.tokens, prompt)
            if entry.scope == scope and n >= self.min_tokens and n > length:
                best, length = entry, n
        return best, length

    def restore(self, engine: StateEngine, prompt: list[int], scope: int = 0, held: int = 0) -> int:
        """Load the best entry into `engine` when it holds more of `prompt` than the `held` tokens the context
        may keep; the prompt tokens it holds (the generation keeps them). A state file that fails to load (or
        that the writer evicted meanwhile) is skipped: the prompt decodes."""
        self.restored_tokens = 0
        entry, length = self.best(prompt, scope)
        if entry is None or length <= held:
            return 0
        try:
            engine.load_state(entry.state)
        except BmoeError:  # unreadable, or more tokens than this context holds: the prompt decodes
            return 0
        with self._entries_lock:
            if entry in self._entries:
                self._entries.remove(entry)
                self._entries.append(entry)
        with contextlib.suppress(OSError):
            os.utime(entry.state)  # most recently used, across restarts too
        self.restored_tokens = length
        return length

    def restore_before(self, engine: StateEngine, prompt: list[int], scope: int, reuse_kv: bool) -> bool:
        """Before a generation of `prompt` begins in the engine's one sequence: the best entry restored where it
        holds more than the context may keep (with `reuse_kv`, their common prefix); whether the generation then
        reuses the context."""
        held = common_prefix(engine.context_tokens, prompt) if reuse_kv else 0
        return self.restore(engine, prompt, scope, held) > 0 or reuse_kv

    def store_after_prompt(self, engine: StateEngine, prompt: list[int], scope: int, decoded: int) -> bool:
        """Once `prompt` is in (its first token out, `decoded` tokens in that step): kept when the step decoded at
        least min_tokens (a prompt mostly reused or restored is held already). Never raises, as `store`."""
        return decoded >= self.min_tokens and self.store(engine, prompt, scope)

    def store(self, engine: StateEngine, prompt: list[int], scope: int = 0) -> bool:
        """Keep the context's state after `prompt` was decoded, unless it is short, an entry holds it all, a
        state is still being written (one at a time: the memory it takes is bounded), or it is larger than the
        scope's share of the budget or than MEMORY_FRACTION of the memory available (its size estimated from
        the last state's bytes per token: the first is taken unchecked). On the engine thread this only copies
        the state into memory; the disk is the writer thread's. Never raises: a store that fails is a warning
        (said once per cause)."""
        tokens = engine.context_tokens
        n = common_prefix(tokens, prompt)
        if n < self.min_tokens or self._holds(tokens, n, scope) or not self.flush(0):
            return False
        estimate = int(self._bytes_per_token * len(tokens))   # 0 before the first state: not known yet
        if estimate > self.share_bytes:
            self._warn("share", self._too_large(estimate))
            return False
        available = _memory_available()
        if available is not None and estimate > MEMORY_FRACTION * available:
            self._warn("memory", f"a prompt's state (~{_mib(estimate)}) is more than {MEMORY_FRACTION:.0%} of the "
                       f"memory available now ({_mib(available)}): it is not copied to be written, nor kept")
            return False
        try:
            fd = _take(engine)
        except (BmoeError, OSError) as exc:   # no memfd here (a filter refused it), or no memory for the copy
            self._warn(f"take:{getattr(exc, 'errno', None) or 'engine'}", f"the prompt's state could not be "
                       f"taken into memory ({exc}): this prompt is not kept")
            return False
        size = os.fstat(fd).st_size
        self._bytes_per_token = size / len(tokens)
        if size > self.share_bytes:
            os.close(fd)
            self._warn("share", self._too_large(size))
            return False
        snapshot = _Snapshot(fd, size, list(tokens), scope)
        self._writing = threading.Thread(target=self._write, args=(snapshot,), name="bmoe-prompt-cache", daemon=True)
        self._writing.start()
        return True

    def _holds(self, tokens: list[int], n: int, scope: int) -> bool:
        with self._entries_lock:
            return any(e.scope == scope and common_prefix(e.tokens, tokens) >= n for e in self._entries)

    def _too_large(self, size: int) -> str:
        return (f"a prompt's state ({_mib(size)}) is larger than a tenant's share of the prompt cache's budget "
                f"({_mib(self.share_bytes)} of {_mib(self.total_bytes)}, --prompt-cache-mb): such prompts are not "
                "kept")

    # -- the writer thread -------------------------------------------------------------------------------

    def _write(self, snapshot: _Snapshot) -> None:
        digest = _tokens_digest(snapshot.tokens)
        name = self.path if self.single else self.path / f"{digest[:24]}-{snapshot.scope}.state"
        partial = name.with_name(name.name + ".partial")
        record_partial = self._record_path(name).with_name(self._record_path(name).name + ".partial")
        record = json.dumps({"format": FORMAT, "identity": self.identity, "scope": snapshot.scope,
                             "tokens": snapshot.tokens, "digest": digest}).encode()
        size = snapshot.size + len(record)
        try:
            with self._entries_lock:
                victims = self._victims(snapshot.scope, size, replacing=name)
            self._check_room(size, sum(v.bytes for v in victims if v.state.exists()))
            for victim in victims:
                self._drop(victim)
            with os.fdopen(os.dup(snapshot.fd), "rb") as source, open(partial, "wb") as out:
                shutil.copyfileobj(source, out, _COPY_CHUNK)
            record_partial.write_bytes(record)
            # The record first: a state file is never without the record that vouches for it.
            os.replace(record_partial, self._record_path(name))
            os.replace(partial, name)
        except _NoRoom as exc:
            self._warn(exc.cause, str(exc))
            return
        except OSError as exc:   # a full, read-only or failing filesystem: the cache's loss, never the answer's
            for path in (partial, record_partial):
                with contextlib.suppress(OSError):
                    path.unlink()
            cause = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            self._warn(f"write:{cause}", f"a prompt's state could not be written to {self.path} ({cause}: "
                       f"{exc.strerror or exc}): it is not kept")
            return
        except Exception as exc:   # a fault of ours: this thread prints no traceback beside the server's answers
            self._warn(f"fault:{type(exc).__name__}", f"a prompt's state was not written ({type(exc).__name__}: "
                       f"{exc})")
            return
        finally:
            os.close(snapshot.fd)
        with self._entries_lock:
            self._entries = [e for e in self._entries if e.state != name]
            self._entries.append(_Entry(name, snapshot.tokens, snapshot.scope, size))

    def _victims(self, scope: int, size: int, replacing: Path | None = None) -> list[_Entry]:
        """The entries to evict (least recently used first) before `size` more bytes of `scope` are kept: its
        own beyond its share or entry count, then any beyond the whole budget (a scope no key has any more)."""
        kept = [e for e in self._entries if e.state != replacing]
        victims = [e for e in self._entries if e.state == replacing]
        own = [e for e in kept if e.scope == scope]
        new = 1 if size else 0   # 0: only bring what is kept within the budget (at load)
        while own and (sum(e.bytes for e in own) + size > self.share_bytes or len(own) + new > self.max_entries):
            victims.append(own.pop(0))
        rest = [e for e in kept if e not in victims]
        while rest and sum(e.bytes for e in rest) + size > self.total_bytes:
            victims.append(rest.pop(0))
        return victims

    def _check_room(self, size: int, freed: int) -> None:
        """Refuse a state the filesystem cannot take and still keep RESERVE_FRACTION of itself free."""
        fs = os.statvfs(self.path.parent if self.single else self.path)
        free, reserve = fs.f_bavail * fs.f_frsize + freed, int(RESERVE_FRACTION * fs.f_blocks * fs.f_frsize)
        if free - size < reserve:
            raise _NoRoom("reserve", f"{self.path}'s filesystem would have {_mib(max(0, free - size))} free after "
                          f"a prompt's state ({_mib(size)}), less than the {_mib(reserve)} it keeps free "
                          f"({RESERVE_FRACTION:.0%}): prompts are not kept while it is this full")

    def _drop(self, entry: _Entry) -> None:
        """Delete an entry's files (the state first: a state file is never without its record); it leaves the
        list once they are gone, so a file that cannot be deleted (OSError: a read-only filesystem) is still
        counted in the budget."""
        for path in (entry.state, self._record_path(entry.state)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        with self._entries_lock, contextlib.suppress(ValueError):
            self._entries.remove(entry)

    def _warn(self, cause: str, line: str) -> None:
        """A store that did not happen, said once per cause: the answer is not affected, and a full disk
        would otherwise say it for every prompt."""
        if cause not in self._warned:
            self._warned.add(cause)
            self._warn_line(f"prompt cache: {line} (said once)")


def _take(engine: StateEngine) -> int:
    """The engine's state in a memfd (memory, no file anywhere): llama.cpp writes it through the descriptor's
    /proc path, as it would a file."""
    fd = os.memfd_create("bmoe-prompt-state", os.MFD_CLOEXEC)
    try:
        engine.save_state(f"/proc/self/fd/{fd}")
    except BaseException:
        os.close(fd)
        raise
    return fd
