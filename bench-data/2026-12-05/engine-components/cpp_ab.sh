#!/bin/bash
# The engine's lone decode path before (2eb0e23, Engine::Impl's begin/next) and after (the one step): the same
# commands, old and new alternating, on the 276 MB qwen3moe-shaped tune model, one thread.
M=~/.cache/bmoe-edge/bench/tune-qwen3-30b-a3b-3g-2l-Q4_0.gguf
LONG=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog.']*30))")
for round in 1 2 3; do
  for v in new old; do
    if [ $v = new ]; then B=/work/main/.venv/bin/bmoe-edge; else B=/tmp/w/old/.venv/bin/bmoe-edge; fi
    for case in short long nostream; do
      case $case in
        short) args=(-p "Once upon a time" -n 128) ;;
        long) args=(-p "$LONG" -n 32) ;;
        nostream) args=(-p "Once upon a time" -n 128 --no-stream) ;;
      esac
      line=$($B generate -m $M "${args[@]}" -t 1 --ctx 1024 --json 2>/dev/null | tail -1)
      python3 -c "import json,sys; d=json.loads(sys.argv[1]); print('$round $v $case', round(d['decode_tok_s'],2), round(d['prompt_tok_s'],2), d['prompt_tokens'], d['generated_tokens'], d['drafted'], d['accepted'], d['run']['speculative'])" "$line"
    done
  done
done
