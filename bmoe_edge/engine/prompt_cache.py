"""The prompt cache: the keys and values of long prompts kept in llama.cpp state files, restored when a later
prompt starts the same way (a system prompt and tools every conversation of a client begins with).

An entry is a state file (`Engine.save_state`: the context's KV cells and their tokens) and beside it a small
JSON record: the model's identity, the tokens' count and digest, and a scope (serve's tenant: one client's
prompts never warm another's). An entry is used only where its identity is this engine's; a directory or file
written for another model or other settings is refused with one line (BmoeError), never loaded: a state file
of a model with the same shapes would load and answer wrongly.

`serve`/`chat` keep one entry per long prompt in a directory (`--prompt-cache DIR`, else a private temporary
one that goes with the process); `generate --prompt-cache FILE` keeps one, in that file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bmoe_edge.errors import BmoeError

__all__ = ["MIN_TOKENS", "PromptCache", "common_prefix", "model_identity"]

FORMAT = "bmoe-prompt-cache/1"
MIN_TOKENS = 256      # shorter prefixes decode in a moment: not worth a state file
MAX_ENTRIES = 16      # a directory keeps the most recently used
_SAMPLES = 16         # stretches of the model file hashed for its identity, besides its head
_SAMPLE_BYTES = 1 << 16
_HEAD_BYTES = 4 << 20  # the gguf header (metadata, tensor table) of any model this runs fits in it

# Settings that change the keys and values a prompt leaves (everything else is bit-identical by the gates).
KV_SETTINGS = ("n_expert_used", "drop_cold", "flash_attn")


class StateEngine(Protocol):
    config: object

    @property
    def context_tokens(self) -> list[int]: ...
    def save_state(self, path: str | Path) -> None: ...
    def load_state(self, path: str | Path) -> None: ...


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


@dataclass
class _Entry:
    state: Path
    tokens: list[int]
    scope: int


class PromptCache:
    """Entries in `path`: a directory (`single=False`) or one file (`single=True`). `path=None`: a private
    temporary directory, removed by `close`."""

    def __init__(self, path: Path | None, identity: str, *, single: bool = False, min_tokens: int = MIN_TOKENS,
                 max_entries: int = MAX_ENTRIES) -> None:
        self.identity = identity
        self.single = single
        self.min_tokens = min_tokens
        self.max_entries = 1 if single else max_entries
        self._temporary = path is None
        self.path = Path(tempfile.mkdtemp(prefix="bmoe-prompt-cache-")) if path is None else path
        self.restored_tokens = 0  # of the last restore
        self._entries: list[_Entry] = []  # most recently used last
        self._load()

    def close(self) -> None:
        if self._temporary:
            shutil.rmtree(self.path, ignore_errors=True)

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
            self.path.mkdir(parents=True, exist_ok=True)
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
            self._entries.append(_Entry(state, tokens, scope))

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
        for entry in self._entries:
            n = common_prefix(entry.tokens, prompt)
            if entry.scope == scope and n >= self.min_tokens and n > length:
                best, length = entry, n
        return best, length

    def restore(self, engine: StateEngine, prompt: list[int], scope: int = 0, held: int = 0) -> int:
        """Load the best entry into `engine` when it holds more of `prompt` than the `held` tokens the context
        may keep; the prompt tokens it holds (the generation keeps them). A state file that fails to load is
        dropped."""
        self.restored_tokens = 0
        entry, length = self.best(prompt, scope)
        if entry is None or length <= held:
            return 0
        try:
            engine.load_state(entry.state)
        except BmoeError:  # unreadable, or more tokens than this context holds: the prompt decodes
            return 0
        self._entries.remove(entry)
        self._entries.append(entry)
        with contextlib.suppress(OSError):
            os.utime(entry.state)  # most recently used, across restarts too
        self.restored_tokens = length
        return length

    def store(self, engine: StateEngine, prompt: list[int], scope: int = 0) -> bool:
        """Keep the context's state after `prompt` was decoded, unless it is short or an entry holds it all."""
        tokens = engine.context_tokens
        n = common_prefix(tokens, prompt)
        if n < self.min_tokens:
            return False
        for entry in self._entries:
            if entry.scope == scope and common_prefix(entry.tokens, tokens) >= n:
                return False
        name = self.path if self.single else self.path / f"{_tokens_digest(tokens)[:24]}-{scope}.state"
        partial = name.with_name(name.name + ".partial")
        engine.save_state(partial)
        record = {"format": FORMAT, "identity": self.identity, "scope": scope, "tokens": tokens,
                  "digest": _tokens_digest(tokens)}
        record_partial = self._record_path(partial)
        record_partial.write_text(json.dumps(record), encoding="utf-8")
        # The record first: a state file is never without the record that vouches for it.
        os.replace(record_partial, self._record_path(name))
        os.replace(partial, name)
        for entry in list(self._entries):
            if entry.state == name:
                self._entries.remove(entry)
        self._entries.append(_Entry(name, list(tokens), scope))
        while len(self._entries) > self.max_entries:
            self._drop(self._entries[0])
        return True

    def _drop(self, entry: _Entry) -> None:
        self._entries.remove(entry)
        for path in (entry.state, self._record_path(entry.state)):
            with contextlib.suppress(OSError):
                path.unlink()
