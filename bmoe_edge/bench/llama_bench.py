"""The real anchor: stock llama.cpp's own `llama-bench`, built from the pin, run with its defaults (the model
resident, repacked kernels on). `bench stream`'s `llama-bench` cell and `bench kernels` compare the engine
against it.

In a checkout it is built from the pin's source (no patches of ours) once per pin and set of switches under the
cache (`$BMOE_EDGE_CACHE/llama-bench/`), with the engine's own build switches for this machine (no
`-march=native`, ggml's default x86 ISA: what the engine's host build compiles), so the two run the same
kernels. An installed release (a board's) has no llama.cpp source: there it is the llama-bench its build made
beside the native module, from the same pin's tree and ggml as the engine, with the board's CPU flags (our
patches leave its kernels as they are: the expert-ready hook is unset, the work buffer kept below 32 MiB).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bmoe_edge import llama_source
from bmoe_edge.errors import BmoeError

# What the engine's top-level CMakeLists.txt fixes that changes the kernels or the binary's needs.
SWITCHES = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DGGML_CPU_REPACK=ON", "-DGGML_OPENMP=OFF",
            "-DGGML_BACKEND_DL=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_RPC=OFF")


def _tool(name: str) -> str:
    """cmake and ninja: the venv's (the build's own dependencies), else the PATH's."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise BmoeError(f"building llama-bench needs {name}: run scripts/setup.sh (it installs it in .venv)")
    return found


# An installed release (a board's) carries the engine built from the pin, not the pin's source to build from.
NOT_INSTALLED = ("an installed release's anchor is the llama-bench its build puts beside the native module: "
                 "rebuild and redeploy it, or run the anchor from a checkout (scripts/setup.sh)")


def build_dir(pin: llama_source.Pin) -> Path:
    key = hashlib.sha256(" ".join((pin.sha256, *SWITCHES)).encode()).hexdigest()[:12]
    return llama_source.cache_dir() / "llama-bench" / f"{pin.version}-{key}"


def _source_pin() -> llama_source.Pin | None:
    """The pin whose source a checkout carries; None in an installed release."""
    try:
        return llama_source.read_pin(llama_source.LLAMA_DIR)
    except FileNotFoundError:
        return None


def binary(say: Any = print) -> Path:
    """The anchor: in a checkout the pin's own llama-bench, built first if it is not there (a few minutes on two
    cores; ccache helps); in an installed release the one beside the native module."""
    pin = _source_pin()
    if pin is None:
        from bmoe_edge.engine import native

        return native.installed_binary("llama-bench", NOT_INSTALLED)
    out = build_dir(pin)
    exe = out / "bin" / "llama-bench"
    if exe.exists():
        return exe
    source, _ = llama_source.fetch(patched=False)
    say(f"building the pin's llama-bench into {out} (once)")
    env = {**os.environ, "CCACHE_BASEDIR": str(source.parent), "CCACHE_NOHASHDIR": "1"}
    for cmd in ([_tool("cmake"), "-G", "Ninja", "-S", str(source), "-B", str(out), *SWITCHES,
                 f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"],
                [_tool("ninja"), "-C", str(out), "llama-bench"]):
        result = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
            raise BmoeError(f"building llama-bench failed ({' '.join(cmd[:2])}):\n{tail}")
    return exe


# llama.cpp pads a context to this many cells (llama-context.cpp: GGML_PAD(n_ctx, 256)).
CONTEXT_PAD = 256


def context_cells(prompt_tokens: int, decode_tokens: int, depth: int = 0) -> int:
    """The context one llama-bench test runs in: its depth, prompt and generated tokens (n_ctx = n_prompt + n_gen +
    n_depth), padded as llama.cpp pads it. An engine compared with it runs in the same: with flash attention off
    llama.cpp keeps the V cache transposed, one row per channel as long as the context, so the same 256 cells decode
    slower in a longer context (5% at 768 against 256 cells on the Q4_K preset;
    bench-data/2026-12-05/kernels-context)."""
    return -(-(prompt_tokens + decode_tokens + depth) // CONTEXT_PAD) * CONTEXT_PAD


def run(model: Path, *, threads: int, decode_tokens: int, prompt_tokens: int, repetitions: int = 1,
        repack: bool = True, flash_attn: str = "auto", depths: Sequence[int] = (0,),
        timeout: float = 3600, wrapper: Sequence[str] = ()) -> dict[str, Any]:
    """llama-bench's tg<decode_tokens> and pp<prompt_tokens> (0: skipped) on `model`, each after each of `depths`
    tokens already in the context (`-d`: untimed, processed once per depth): tok/s of each (`decode_tok_s`,
    `prompt_tok_s`: the mean over every depth's repetitions; `decode_samples`, `prompt_samples`: each one's), with
    llama.cpp's defaults but the thread count and, for a comparison, `repack` and `flash_attn` (off, on, auto:
    llama-bench's default). The depth matters with flash attention: its CPU kernel skips the masked cells, so a
    token attends as many cells as precede it (without it every cell of the context is computed). `wrapper`: how
    this machine starts its own programs (an emulated board's exec wrapper; the caller's profile says)."""
    cmd = [*wrapper, str(binary()), "-m", str(model), "-t", str(threads), "-r", str(repetitions), "-o", "json",
           "--repack", "1" if repack else "0", "-fa", flash_attn, "-n", str(decode_tokens), "-p", str(prompt_tokens),
           "-d", ",".join(str(d) for d in depths)]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BmoeError(f"llama-bench ran over {timeout:.0f} s on {model}") from exc
    if result.returncode != 0:
        raise BmoeError(f"llama-bench failed on {model}: {result.stderr.strip().splitlines()[-1:]}")
    return parse_tests(json.loads(result.stdout))


def parse_tests(tests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """llama-bench's JSON tests by kind: `decode_samples`/`prompt_samples` every repetition's tok/s over all
    depths, `decode_tok_s`/`prompt_tok_s` their mean (a single test's: its `avg_ts`)."""
    samples: dict[str, list[float]] = {}
    for test in tests:
        kind = "prompt" if test["n_prompt"] > 0 and test["n_gen"] == 0 else "decode"
        samples.setdefault(kind, []).extend(float(ts) for ts in test["samples_ts"])
    out: dict[str, Any] = {}
    for kind, values in samples.items():
        out[f"{kind}_tok_s"] = statistics.mean(values)
        out[f"{kind}_samples"] = values
    return out
