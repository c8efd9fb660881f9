"""serve --parallel 2 with two greedy clients at once: --speculative off against ngram (prompt lookup drafting in
the shared batch), alternating, on the 276 MB qwen3moe-shaped tune model, one thread. Aggregate tok/s and
whether the answers are the same."""
import json, re, subprocess, sys, threading, time, urllib.request
from pathlib import Path

M = Path.home() / ".cache/bmoe-edge/bench/tune-qwen3-30b-a3b-3g-2l-Q4_0.gguf"
PROMPTS = ["Once upon a time", "The quick brown fox jumps over the lazy dog. The quick brown fox"]


def serve(spec: str):
    p = subprocess.Popen([sys.executable, "-m", "bmoe_edge", "serve", "-m", str(M), "--port", "0", "-t", "1",
                          "--ctx", "1024", "--parallel", "2", "--speculative", spec],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    while True:
        m = re.search(r"serving (\S+) on (http://[\d.]+:\d+)/v1", p.stderr.readline())
        if m:
            return p, m[1], m[2]


def ask(url, name, prompt, out, i):
    body = json.dumps({"model": name, "prompt": prompt, "max_tokens": 128, "temperature": 0}).encode()
    r = json.loads(urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", body,
                                                                  {"Content-Type": "application/json"})).read())
    out[i] = (r["choices"][0]["text"], r["usage"]["completion_tokens"])


def round_of(spec: str):
    p, name, url = serve(spec)
    try:
        ask(url, name, "Hi", [None], 0)
        out = [None, None]
        t0 = time.perf_counter()
        ts = [threading.Thread(target=ask, args=(url, name, q, out, i)) for i, q in enumerate(PROMPTS)]
        for t in ts: t.start()
        for t in ts: t.join()
        dt = time.perf_counter() - t0
        metrics = urllib.request.urlopen(url + "/metrics").read().decode()
        drafted = re.search(r"^bmoe_draft_tokens_total (\S+)", metrics, re.M)[1]
        accepted = re.search(r"^bmoe_draft_tokens_accepted_total (\S+)", metrics, re.M)[1]
        return sum(n for _, n in out) / dt, [t for t, _ in out], drafted, accepted
    finally:
        p.terminate(); p.wait()


for rnd in range(3):
    for spec in ("off", "ngram") if rnd % 2 == 0 else ("ngram", "off"):
        tok_s, texts, drafted, accepted = round_of(spec)
        print(json.dumps({"round": rnd, "speculative": spec, "tok_s": round(tok_s, 2), "drafted": drafted,
                          "accepted": accepted, "texts": texts}))
