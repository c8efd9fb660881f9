"""Issue 29's prompt-cache target, measured: `bmoe-edge serve` on a 3 GB preset under a RAM cap (a cgroup, as
bench stream's cells), a 1,000-token system prompt. Conversation 1 with it, then one with another system
prompt (so the context no longer holds the first), then conversation 2 with the first system prompt again:
its time to first token against conversation 1's. Then the server restarts with the same --prompt-cache DIR
and conversation 3 (the same system prompt, a new question) is the first request. TTFT is measured by the
client (OpenAI's own, streaming: the first chunk with text). Writes serve_ttft.json beside this file.

usage: serve_ttft.py MODEL CAP_MIB OUT_DIR
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import openai

from bmoe_edge.bench import ramcap
from bmoe_edge.bench.machine import LONG_TEXT, drop_page_cache
from bmoe_edge.engine import Engine, StreamConfig


def system_prompt(model: Path, n_tokens: int, salt: str) -> str:
    with Engine(model, StreamConfig(ctx=256, batch=64, ubatch=64, cache_mb=0)) as e:  # lazy: reads no experts
        text = salt
        while len(e.tokenize(text)) < n_tokens:
            text += " " + LONG_TEXT
        return text


def start(model: Path, cache_dir: Path, cap: ramcap.MemCap) -> tuple[subprocess.Popen, str]:
    cap.prepare()
    proc = subprocess.Popen([sys.executable, "-m", "bmoe_edge", "serve", "-m", str(model), "--port", "0",
                             "--no-auth", "--prompt-cache", str(cache_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cap.preexec)
    assert proc.stderr is not None
    while True:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit(f"serve exited: {proc.wait()}")
        found = re.search(r"on (http://[\d.]+:\d+)/v1", line)
        if found:
            return proc, found[1]


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        return {k: float(v) for k, v in re.findall(r"^(\w+) (\S+)$", r.read().decode(), re.M)}


def ask(url: str, prompt: str) -> dict[str, float]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=900)
    before = metrics(url)
    t0 = time.perf_counter()
    first = None
    for chunk in client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=16, temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].text and first is None:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    after = metrics(url)
    return {"ttft_s": round(first or -1, 3), "total_s": round(total, 3),
            "server_ttft_s": round(after["bmoe_time_to_first_token_seconds"], 3),
            "prompt_tokens": after["bmoe_prompt_tokens_total"] - before["bmoe_prompt_tokens_total"],
            "cached_tokens": after["bmoe_prompt_tokens_reused_total"] - before["bmoe_prompt_tokens_reused_total"],
            "prompt_s": round(after["bmoe_prompt_seconds_total"] - before["bmoe_prompt_seconds_total"], 3),
            "prefill_mib": round((after["bmoe_prefill_bytes_read_total"] - before["bmoe_prefill_bytes_read_total"])
                                 / 2**20, 1)}


def main() -> None:
    model, cap_mib, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    system_a = system_prompt(model, 1000, "System A.")
    system_b = system_prompt(model, 1000, "System B, another assistant entirely.")
    results: dict[str, object] = {"model": str(model), "cap_mib": cap_mib}
    with tempfile.TemporaryDirectory(prefix="prompt-serve-") as tmp:
        cache_dir = Path(tmp) / "prompts"
        drop_page_cache(model)
        cap = ramcap.make_cap(cap_mib * 2**20, "auto")
        proc, url = start(model, cache_dir, cap)
        try:
            results["conversation_1"] = ask(url, system_a + "\nUser: What does the harbour master log?\nAssistant:")
            results["other_system_prompt"] = ask(url, system_b + "\nUser: Who are you?\nAssistant:")
            results["conversation_2"] = ask(url, system_a + "\nUser: When do ships enter?\nAssistant:")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            results["cap_1"] = vars(cap.finish())
        drop_page_cache(model)
        cap = ramcap.make_cap(cap_mib * 2**20, "auto")
        proc, url = start(model, cache_dir, cap)
        try:
            results["after_restart"] = ask(url, system_a + "\nUser: And the crew?\nAssistant:")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            results["cap_2"] = vars(cap.finish())
    c1 = results["conversation_1"]["ttft_s"]  # type: ignore[index]
    results["ratio_conversation_2"] = round(results["conversation_2"]["ttft_s"] / c1, 4)  # type: ignore[index]
    results["ratio_after_restart"] = round(results["after_restart"]["ttft_s"] / c1, 4)  # type: ignore[index]
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_ttft.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
