"""Issue 29, in `serve`: a 1,000-token prompt to a fresh server (40% cap, Pi 5 Gen 2 throttle, pool warm) whose
batch and ubatch are the context's (serve's default now, runner.fit_to_conversation: one ubatch of 1,000 tokens)
or the table's 512 (what serve did, two ubatches: batch and ubatch are no setting a user can give, so this
server runs with runner.fit_to_conversation replaced by the identity, the code before it). Prefill bytes and TTFT, rounds in
alternating order. Writes serve-ubatch.jsonl beside this file.

usage: serve_ubatch.py MODEL CAP_MIB [ROUNDS] [TOKENS]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from serve_warm import one, prompt_of

BEFORE = ("-c", "import sys; import bmoe_edge.engine.runner as r; r.fit_to_conversation = lambda c, fixed=(): c; "
               "sys.argv[0] = 'bmoe-edge'; from bmoe_edge.cli import run; run()")
SETTINGS = {"default": ("-m", "bmoe_edge"), "ubatch-512": BEFORE}


def main() -> None:
    model, cap_mib = Path(sys.argv[1]), int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
    out = Path(__file__).with_name("serve-ubatch.jsonl")
    with out.open("a") as f:
        for r in range(rounds):
            for name in list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]:
                row = {"round": r, "setting": name,
                       **one(model, cap_mib, "warm", prompt_of(model, tokens, f"Round {r} {name}."), SETTINGS[name])}
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
