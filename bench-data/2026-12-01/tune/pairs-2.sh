#!/bin/bash
# generate with the second tuned profile (io_threads 2) vs untuned, alternating; then -t 2 untuned vs auto
cd "$(dirname "$0")" && . ../../campaign.sh
M=/tmp/tune-bench/qwen3-30b-a3b-3g-Q4_0.gguf   # the 2.9 GB preset, qwen3-30b-a3b-3g Q4_0
gen() { # label xdg [extra args]
  XDG_CONFIG_HOME=$2 "$BMOE" generate -m $M -p "Once upon a time" -n 32 --json ${@:3} 2>/dev/null \
    | run_line "$1" threads io_threads read_path cache_budget_mb decode_tok_s:.3f cache_hit_pct:.1f
}
gen "untuned r1" /tmp/empty-xdg; gen "tuned2 r1" /tmp/tune-xdg-3g2
gen "tuned2 r2" /tmp/tune-xdg-3g2; gen "untuned r2" /tmp/empty-xdg
gen "untuned r3" /tmp/empty-xdg; gen "tuned2 r3" /tmp/tune-xdg-3g2
gen "untuned -t 2 r1" /tmp/empty-xdg -t 2; gen "untuned auto r4" /tmp/empty-xdg; gen "untuned -t 2 r2" /tmp/empty-xdg -t 2
echo done $(date -u +%T)
