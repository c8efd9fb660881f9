#!/bin/bash
# More rounds of the short case (a 6-token prompt, 256 tokens decoded), old and new alternating.
M=~/.cache/bmoe-edge/bench/tune-qwen3-30b-a3b-3g-2l-Q4_0.gguf
for round in ${ROUNDS:-1 2 3 4 5 6}; do
  for v in ${ORDER:-new old}; do
    if [ $v = new ]; then B=/work/main/.venv/bin/bmoe-edge; else B=/tmp/w/old/.venv/bin/bmoe-edge; fi
    line=$($B generate -m $M -p "Once upon a time" -n 256 -t 1 --ctx 1024 --json 2>/dev/null | tail -1)
    python3 -c "import json,sys; d=json.loads(sys.argv[1]); print('$round $v short256', round(d['decode_tok_s'],2), round(d['cache_hit_pct'],1), d['bytes_read'])" "$line"
  done
done
