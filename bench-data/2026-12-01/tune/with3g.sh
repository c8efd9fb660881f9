#!/bin/bash
# tune -m the 3 GB preset, then generate with the untuned and the tuned profile, alternating (README.md)
cd "$(dirname "$0")" && . ../../campaign.sh
M=/tmp/tune-bench/qwen3-30b-a3b-3g-Q4_0.gguf   # the 2.9 GB preset, qwen3-30b-a3b-3g Q4_0
stamp "tune -m 3g"
s=$(date +%s)
XDG_CONFIG_HOME=/tmp/tune-xdg-3g "$BMOE" tune -m $M --json > /tmp/tune-data/tune-3g.json 2> /tmp/tune-data/tune-3g.err
echo "tune rc=$? wall $(( $(date +%s) - s )) s"
cp /tmp/tune-xdg-3g/bmoe-edge/profiles/host.yaml /tmp/tune-data/tune-3g.yaml
mkdir -p /tmp/empty-xdg
gen() { # label xdg
  XDG_CONFIG_HOME=$2 "$BMOE" generate -m $M -p "Once upon a time" -n 32 --json 2>/dev/null \
    | run_line "$1" threads io_threads read_path decode_tok_s:.3f prompt_ms:.0f cache_hit_pct
}
gen warmup /tmp/empty-xdg
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then gen "untuned r$r" /tmp/empty-xdg; gen "tuned r$r" /tmp/tune-xdg-3g
  else gen "tuned r$r" /tmp/tune-xdg-3g; gen "untuned r$r" /tmp/empty-xdg; fi
done
echo done $(date -u +%T)
