#!/bin/sh
# The 2026-12-01 quiet re-run of the memory campaign (issue 11), as run (then from the repository root with the
# venv's bmoe-edge on PATH), on an otherwise idle machine. Same models and cells as 2026-11-30; the 70% cap
# re-runs only uniform routing, where 2026-11-30 left one budget within noise of the cache off.
set -eu
cd "$(dirname "$0")" && . ../campaign.sh
U=$(model "$BENCH/qwen3-30b-a3b-3g-Q4_0-skew0-v32k.gguf" $(q3g_args uniform) --vocab-size 32000)
S=$(model "$BENCH/qwen3-30b-a3b-3g-Q4_0-skew0.8-v32k.gguf" $(q3g_args skewed) --vocab-size 32000)
CELLS=resident,mmap,defaults,off-overlap-od4,off-serial-od1,off-serial-od4,cache200-overlap-od4,cache400-overlap-od4,cache700-overlap-od4,auto-overlap-od4,fullcache-overlap,io-od4,io-od1
for m in uniform:$U skewed:$S; do
  name=${m%%:*}; model=${m#*:}
  uptime
  stream $name-40 -m "$model" --ram-cap 40% --tokens 64 --mmap-tokens 16 --repeats 2 --budgets 200,400,700 \
    --io-seconds 1 --cells $CELLS
done
uptime
stream uniform-70 -m "$U" --ram-cap 70% --tokens 64 --mmap-tokens 16 --repeats 2 --budgets 400,900,1500 \
  --io-seconds 1 --cells mmap,defaults,off-overlap-od4,cache400-overlap-od4,cache900-overlap-od4,cache1500-overlap-od4,auto-overlap-od4
uptime
