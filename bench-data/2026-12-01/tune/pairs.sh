#!/bin/bash
# more tuned/untuned generate pairs on the 3 GB preset, alternating order, the run record's settings kept
cd "$(dirname "$0")" && . ../../campaign.sh
M=/tmp/tune-bench/qwen3-30b-a3b-3g-Q4_0.gguf   # the 2.9 GB preset, qwen3-30b-a3b-3g Q4_0
gen() { # label xdg
  XDG_CONFIG_HOME=$2 "$BMOE" generate -m $M -p "Once upon a time" -n 32 --json 2>/dev/null \
    | run_line "$1" threads io_threads read_path cache_budget_mb cache_margin_mb decode_tok_s:.3f cache_hit_pct:.1f
}
for r in 4 5 6 7; do
  if [ $((r % 2)) = 1 ]; then gen "untuned r$r" /tmp/empty-xdg; gen "tuned r$r" /tmp/tune-xdg-3g
  else gen "tuned r$r" /tmp/tune-xdg-3g; gen "untuned r$r" /tmp/empty-xdg; fi
done
echo done $(date -u +%T)
