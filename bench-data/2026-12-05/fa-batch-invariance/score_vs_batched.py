from dataclasses import replace
from bmoe_edge.engine import Engine, StreamConfig
from bmoe_edge.synthetic import tinymoe
import sys
m = str(tinymoe.fixture("qwen3moe", "Q8_0"))
text = "The quick brown fox jumps over the lazy dog and then some more words follow here"
for fa in (False, True):
    for stream in (False, True):
        with Engine(m, replace(StreamConfig(), flash_attn=fa, stream=stream, threads=2)) as e:
            ids = e.tokenize(text)
            one = e.score(ids)
            bat = [p.chosen.logprob for p in e.score_positions(ids, batched=True)]
            print("fa", fa, "stream", stream, "max diff", max(abs(a - b) for a, b in zip(one, bat)))
