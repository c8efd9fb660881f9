"""The Python face of the native engine: one model and its context, generation as an iterator."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from bmoe_edge.engine import chat, checksums, native, rpc
from bmoe_edge.engine.generation import Generation, Sampling, Token, TokenMetrics
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.errors import BmoeError


def _metrics(m) -> TokenMetrics:
    return TokenMetrics(**{f.name: getattr(m, f.name) for f in fields(TokenMetrics)})


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


def run_info_fields(info: Any) -> tuple[str, ...]:
    """The fields of the native RunInfo: whatever the engine reports (a field added in C++ shows up
    in `--json` and the CSV without a Python edit)."""
    return tuple(name for name in dir(info) if not name.startswith("_") and not callable(getattr(info, name)))


class Engine:
    """One model, one context. `with Engine(path, config) as e: for tok in e.generate(...)`.

    After a failure (a read error, a checksum mismatch, the I/O deadline, the model file changing on
    disk) the generation is over: it raised BmoeError, and stepping it again raises too. The engine
    itself stays usable: the next `generate`/`run` starts a new generation on a cleared KV cache
    (and fails again at once if the model file changed). A prompt is text: special-token names in
    it stay text unless the config says `parse_special`."""

    def __init__(self, model_path: str | Path, config: StreamConfig | None = None) -> None:
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

    @property
    def run_info(self) -> dict[str, object]:
        with self._using() as engine:
            info = engine.run_info
            return {name: getattr(info, name) for name in run_info_fields(info)}

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool | None = None) -> list[int]:
        """Token ids of `text` (BOS added when `add_special`); control-token names in it are parsed only
        with `parse_special` (default: the config's, off unless asked: a prompt is text)."""
        special = self.config.parse_special if parse_special is None else parse_special
        with self._using() as engine, native.engine_errors():
            return list(engine.tokenize(text, add_special, special))

    def detokenize(self, tokens: list[int]) -> str:
        with self._using() as engine:
            return engine.detokenize(tokens)

    def score(self, tokens: list[int]) -> list[float]:
        """Teacher-forced log-probabilities (natural log) of tokens[1:], each after the ones before it.
        Clears the context."""
        with self._using() as engine, native.engine_errors():
            return list(engine.score(list(tokens)))

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
        `reuse_kv` keeps the context's longest common prefix with the prompt (decoding only the rest)."""
        self._live()
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        params = (sampling or Sampling()).to_native()
        out = result if result is not None else Generation(prompt_ids)
        out.prompt_tokens = prompt_ids
        with self._using() as engine, native.engine_errors():
            out.reused_tokens = engine.begin(prompt_ids, params, logits, reuse_kv)
        pending = b""
        step = self._step()
        while len(out.tokens) < max_tokens:
            with self._using() as engine, native.engine_errors():
                advanced = engine.next(step)
            if not advanced:
                out.stop_reason = "context_full"
                return
            metrics = _metrics(step.metrics)
            out.metrics.append(metrics)
            if logits:
                out.logits.append(step.logits)
            if step.end_of_generation:
                out.stop_reason = "end_of_generation"
                return
            # A piece can end inside a multi-byte character: emit text only when it decodes.
            pending += step.piece
            try:
                text = pending.decode("utf-8")
                pending = b""
            except UnicodeDecodeError:
                text = ""
            out.tokens.append(step.token)
            out.text += text
            yield Token(step.token, text, metrics, step.logits if logits else b"")
        out.stop_reason = "max_tokens"

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

