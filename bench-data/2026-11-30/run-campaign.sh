#!/bin/sh
# The 2026-11-30 memory campaign, as run (then from the repository root, with the venv's bmoe-edge on PATH).
# Models are generated, never committed: they land in $BENCH (named here with -v32k: a 32,000-token
# vocabulary, so ~190 MB of dense weights).
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
for m in uniform:$U skewed:$S; do
  name=${m%%:*}; model=${m#*:}
  uptime
  stream $name-70 -m "$model" --ram-cap 70% --tokens 64 --mmap-tokens 16 --repeats 2 --budgets 400,900,1500 \
    --io-seconds 1 --cells mmap,defaults,off-overlap-od4,cache400-overlap-od4,cache900-overlap-od4,cache1500-overlap-od4,auto-overlap-od4
done
uptime
