"""The Python face of the native engine: one model and its context, generation as an iterator."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bmoe_edge.engine import chat, checksums, native, prompt_cache, rpc
from bmoe_edge.engine.generation import (
    RUN_INFO_FIELDS,
    Generation,
    PieceText,
    PositionLogprobs,
    Sampling,
    Token,
    token_of,
)
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.errors import BmoeError


def _check_workers(config: StreamConfig, protocol: str) -> None:
    """Before any load: every worker reachable, of this protocol version, and on loopback (an SSH tunnel
    ends there) unless the config says rpc_insecure. ggml-rpc would abort the process instead."""
    endpoints = rpc.parse_endpoints(config.rpc)
    exposed = [e for e in endpoints if not e.loopback]
    if exposed and not config.rpc_insecure:
        raise BmoeError(f"--rpc {exposed[0]}: the RPC protocol has no authentication or encryption (anyone who "
                        "reaches the port can drive the worker and read the weights); reach the worker through an "
                        "SSH tunnel ending on 127.0.0.1, or pass --rpc-insecure on a network you trust")
    if config.rpc_split:
        rpc.parse_split(config.rpc_split, len(endpoints))
    rpc.probe_all(endpoints, protocol)


# The run info's keys: the native RunInfo's rows (bmoe/metrics.h), by name as `--json` has always listed them (a
# field added in C++ shows up in `--json` and the CSV without a Python edit).
RUN_INFO_KEYS: tuple[str, ...] = tuple(sorted(f.name for f in RUN_INFO_FIELDS))


# Scoring's chunk without `batched`: the positions one native call decodes one by one between two looks at
# `cancelled` (a few seconds on a board).
SCORE_CHUNK = 8


class ScoringCancelled(Exception):
    """`score_positions` stopped because its `cancelled()` said so (a client that hung up): not a failure, and the
    positions scored so far are dropped. The context holds the text's first `scored` tokens."""

    def __init__(self, scored: int) -> None:
        super().__init__(f"scoring cancelled after {scored} positions")
        self.scored = scored


# What an idle engine faults in per step (serve between requests, chat while the user types): ~20 ms at the
# slowest first touch measured (a VM's, 420 MB/s), so a request that arrives meanwhile waits no longer.
IDLE_WARM_STEP = 8 << 20


class Engine:
    """One model, one context. `with Engine(path, config) as e: for tok in e.generate(...)`.

    After a failure (a read error, a checksum mismatch, the I/O deadline, the model file changing on
    disk) the generation is over: it raised BmoeError, and stepping it again raises too. The engine
    itself stays usable: the next `generate`/`run` starts a new generation on a cleared KV cache
    (and fails again at once if the model file changed). A prompt is text: special-token names in
    it stay text unless the config says `parse_special`."""

    def __init__(self, model_path: str | Path, config: StreamConfig | None = None, *,
                 prompt_cache_kind: str = "", prompt_cache_budget: prompt_cache.Budget | None = None) -> None:
        """`prompt_cache_kind`: how the config's prompt_cache is kept — "file" (one prompt: generate), "dir"
        (one file per long prompt; a private directory of the process where the config names none: serve), or
        "" (a directory only where the config names one). `prompt_cache_budget`: its bytes on disk and their
        tenants (default: prompt_cache.default_budget_bytes, one tenant; 0 MB: no prompt cache)."""
        self.config = config or StreamConfig()
        n = native.load()
        if self.config.rpc:
            _check_workers(self.config, n.build_info().rpc_protocol)
        native_config = self.config.to_native()
        if self.config.verify_slices and self.config.stream:
            native_config.slice_sums = checksums.slice_sums(Path(model_path))
        # One native call at a time: close() waits for a begin()/next() running on another thread (a server's
        # engine thread) instead of freeing the engine under it; after close every call is "closed".
        self._lock = threading.RLock()
        with native.engine_errors():
            self._native = n.Engine(str(model_path), native_config)
        self._step = n.StepResult
        self.prompt_cache: prompt_cache.PromptCache | None = None
        self.prompt_scope = 0  # whose prompts the cache may restore (serve: the tenant)
        budget = prompt_cache_budget or prompt_cache.Budget()
        if (self.config.prompt_cache or prompt_cache_kind == "dir") and not budget.off:
            try:
                identity = prompt_cache.model_identity(Path(model_path), self.config, n.build_info().llama_commit)
                path = Path(self.config.prompt_cache) if self.config.prompt_cache else None
                self.prompt_cache = prompt_cache.PromptCache(path, identity, single=prompt_cache_kind == "file",
                                                             budget=budget)
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Free the engine now, even where something (a traceback's frame) still refers to it."""
        with self._lock:
            if self._native is not None:
                self._native.close()
            self._native = None
            if getattr(self, "prompt_cache", None) is not None:
                self.prompt_cache.close()

    @property
    def run_info(self) -> dict[str, object]:
        with self._using() as engine:
            info = engine.run_info
            return {name: getattr(info, name) for name in RUN_INFO_KEYS}

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool | None = None) -> list[int]:
        """Token ids of `text` (BOS added when `add_special`); control-token names in it are parsed only
        with `parse_special` (default: the config's, off unless asked: a prompt is text)."""
        special = self.config.parse_special if parse_special is None else parse_special
        with self._using() as engine, native.engine_errors():
            return list(engine.tokenize(text, add_special, special))

    def detokenize(self, tokens: list[int]) -> str:
        with self._using() as engine:
            return engine.detokenize(tokens)

    def token_piece(self, token: int) -> bytes:
        """One token's bytes (part of a UTF-8 character, maybe)."""
        with self._using() as engine, native.engine_errors():
            return bytes(engine.detokenize_bytes([token]))

    def text(self, tokens: list[int]) -> str:
        """The text of token ids, whatever they are (bytes that are not UTF-8 become U+FFFD)."""
        with self._using() as engine, native.engine_errors():
            return bytes(engine.detokenize_bytes(list(tokens))).decode("utf-8", "replace")

    def score(self, tokens: list[int]) -> list[float]:
        """Teacher-forced log-probabilities (natural log) of tokens[1:], each after the ones before it.
        Clears the context."""
        with self._using() as engine, native.engine_errors():
            return list(engine.score(list(tokens)))

    def score_positions(self, tokens: Sequence[int], n_top: int = 0, *, cancelled: Callable[[], bool] | None = None,
                        batched: bool = False) -> list[PositionLogprobs]:
        """`score`'s pass, each position of tokens[1:] with its `n_top` most likely tokens too. Clears the
        context. In chunks, one native call each (the engine's lock is let go between them, so `close` waits for
        one chunk at most): before each, `cancelled()` (when given) may stop it with ScoringCancelled.
        `batched` decodes a chunk as one batch, logits at every position (`score_batch` of them: several times
        faster on a long text; values within float rounding of the unbatched ones); without it one token per
        decode, as generation runs and `score` measures (a lossy knob's results depend on the batch)."""
        ids = list(tokens)
        out: list[PositionLogprobs] = []
        while True:
            if cancelled is not None and cancelled():
                raise ScoringCancelled(len(out))
            with self._using() as engine, native.engine_errors():
                chunk = self.score_batch if batched else SCORE_CHUNK
                scored = engine.score_positions(ids, n_top, len(out), chunk, batched)
            out.extend(PositionLogprobs.from_native(p) for p in scored)
            if len(out) >= len(ids) - 1:
                return out

    @property
    def score_batch(self) -> int:
        """The positions one batched decode of `score_positions(batched=True)` scores, its chunk: the context's
        batch, at most as many as keep the logits llama.cpp holds for them within 16 MiB."""
        with self._using() as engine:
            return int(engine.score_batch)

    @property
    def vocab_size(self) -> int:
        with self._using() as engine:
            return int(engine.vocab_size)

    @property
    def chat_template(self) -> str:
        """The model's own chat template (its Jinja source), "" when the file has none."""
        with self._using() as engine:
            return engine.chat_template

    def chat_templates(self, source: str = "") -> Any:
        """llama.cpp common's templates for this model: its own, or `source` (a Jinja source or "chatml"),
        with the model's BOS/EOS (engine/chat.py)."""
        with self._using() as engine, native.engine_errors():
            return native.load().ChatTemplates(engine, source)

    @property
    def context_tokens(self) -> list[int]:
        """The tokens whose keys and values the context holds."""
        with self._using() as engine:
            return list(engine.context_tokens)

    def reset(self) -> None:
        """Forget the context: the next generation decodes its whole prompt."""
        with self._using() as engine:
            engine.reset()

    def warm_cache_memory(self, max_bytes: int = IDLE_WARM_STEP) -> int:
        """Between generations: fault in up to `max_bytes` of the memory the expert cache may fill, so the next
        prompt's reads do not wait for the kernel to zero it. Returns the bytes still to do (0: warm)."""
        with self._using() as engine, native.engine_errors():
            return int(engine.warm_cache_memory(max_bytes))

    def save_state(self, path: str | Path) -> None:
        """Write the context (KV cache and its tokens) to a llama.cpp state file."""
        with self._using() as engine, native.engine_errors():
            engine.save_state(str(path))

    def load_state(self, path: str | Path) -> None:
        """Restore a context written by `save_state` (same model, same context size)."""
        with self._using() as engine, native.engine_errors():
            engine.load_state(str(path))

    def chat(self, messages: Sequence[Any], max_tokens: int, sampling: Sampling | None = None, *,
             think: bool | None = None, template: str | None = None) -> Iterator[Any]:
        """Answer a conversation: yields `chat.Delta`s (answer text and reasoning apart). The context is
        kept between calls, so a conversation's next turn decodes only what is new."""
        return chat.reply(self, messages, max_tokens, sampling, think=think, template=template)

    def generate(
        self,
        prompt: str | list[int],
        max_tokens: int,
        sampling: Sampling | None = None,
        *,
        logits: bool = False,
        result: Generation | None = None,
        reuse_kv: bool = False,
    ) -> Iterator[Token]:
        """Yield tokens as they are generated; `result` (if given) is filled in along the way.
        `reuse_kv` keeps the context's longest common prefix with the prompt (decoding only the rest). With a
        prompt cache, a longer prefix it holds (in this `prompt_scope`) is restored first, and a long prompt is
        kept there once decoded."""
        started = time.perf_counter()
        self._live()
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        params = (sampling or Sampling()).to_native()
        out = result if result is not None else Generation(prompt_ids)
        out.prompt_tokens = prompt_ids
        cache = self.prompt_cache
        if cache is not None:
            reuse_kv = cache.restore_before(self, prompt_ids, self.prompt_scope, reuse_kv)
        with self._using() as engine, native.engine_errors():
            out.reused_tokens = engine.begin(prompt_ids, params, logits, reuse_kv)
        text = PieceText()
        step = self._step()
        while len(out.tokens) < max_tokens:
            with self._using() as engine, native.engine_errors():
                advanced = engine.next(step)
            if not advanced:
                out.stop_reason = "context_full"
                return
            token = token_of(step, text)
            going_on = out.add(token, step.end_of_generation, started, max_tokens=max_tokens, logits=logits)
            if len(out.metrics) == 1 and cache is not None:
                with self._using():   # the state copied to memory; the writer thread puts it on disk
                    cache.store_after_prompt(self, prompt_ids, self.prompt_scope, token.metrics.n_tokens)
            if not step.end_of_generation:
                yield token
            if not going_on:
                return
        out.stop_reason = "max_tokens"

    # --parallel's slots (engine/batching.py drives them): thin calls, one native call at a time.
    @property
    def n_slots(self) -> int:
        with self._using() as engine:
            return int(engine.n_slots)

    def slot_begin(self, slot: int, prompt_ids: Sequence[int], sampling: Sampling | None = None, *,
                   logits: bool = False, reuse_kv: bool = False) -> int:
        """Start a generation in `slot`; returns the prompt tokens the slot already held (with `reuse_kv`)."""
        params = (sampling or Sampling()).to_native()
        with self._using() as engine, native.engine_errors():
            return int(engine.slot_begin(slot, list(prompt_ids), params, logits, reuse_kv))

    def slot_stop(self, slot: int, *, forget: bool = False) -> None:
        """End the slot's generation; its context stays for a returning conversation unless `forget`."""
        with self._using() as engine, native.engine_errors():
            (engine.slot_clear if forget else engine.slot_stop)(slot)

    def slot_tokens(self, slot: int) -> list[int]:
        with self._using() as engine, native.engine_errors():
            return list(engine.slot_tokens(slot))

    def step_slots(self) -> Any:
        """One batched decode of every active slot (the native BatchStep; engine/batching.py reads it)."""
        with self._using() as engine, native.engine_errors():
            return engine.step_slots()

    def run(self, prompt: str | list[int], max_tokens: int, sampling: Sampling | None = None, *,
            logits: bool = False) -> Generation:
        """Generate to the end and return everything."""
        result = Generation([])
        for _ in self.generate(prompt, max_tokens, sampling, logits=logits, result=result):
            pass
        return result

    @contextlib.contextmanager
    def _using(self) -> Iterator[Any]:
        """The native engine, held for one call (close waits for it)."""
        with self._lock:
            yield self._live()

    def _live(self):
        if self._native is None:
            raise BmoeError("the engine is closed")
        return self._native

