#!/bin/sh
# The 2026-11-30 memory campaign, as run (from the repository root, with the venv's bmoe-edge on PATH).
# Models are generated, never committed: they land in ${BMOE_EDGE_CACHE:-~/.cache/bmoe-edge}/bench/
# (renamed here with -v32k: a 32,000-token vocabulary, so ~190 MB of dense weights).
set -eu
D=docs/bench-data/2026-11-30
B=${BMOE_EDGE_CACHE:-$HOME/.cache/bmoe-edge}/bench
U=$B/qwen3-30b-a3b-3g-Q4_0-skew0-v32k.gguf
S=$B/qwen3-30b-a3b-3g-Q4_0-skew0.8-v32k.gguf
[ -f "$U" ] || { bmoe-edge tiny-model --preset qwen3-30b-a3b-3g --routing-skew 0 --vocab-size 32000; \
  mv "$B/qwen3-30b-a3b-3g-Q4_0-skew0.gguf" "$U"; }
[ -f "$S" ] || { bmoe-edge tiny-model --preset qwen3-30b-a3b-3g --routing-skew 0.8 --vocab-size 32000; \
  mv "$B/qwen3-30b-a3b-3g-Q4_0-skew0.8.gguf" "$S"; }
CELLS=resident,mmap,defaults,off-overlap-od4,off-serial-od1,off-serial-od4,cache200-overlap-od4,cache400-overlap-od4,cache700-overlap-od4,auto-overlap-od4,fullcache-overlap,io-od4,io-od1
for m in uniform:$U skewed:$S; do
  name=${m%%:*}; model=${m#*:}
  uptime
  bmoe-edge bench stream -m "$model" --ram-cap 40% --tokens 64 --mmap-tokens 16 --repeats 2 --budgets 200,400,700 \
    --io-seconds 1 --cells $CELLS --out $D/$name-40 > $D/$name-40.log 2>&1
done
for m in uniform:$U skewed:$S; do
  name=${m%%:*}; model=${m#*:}
  uptime
  bmoe-edge bench stream -m "$model" --ram-cap 70% --tokens 64 --mmap-tokens 16 --repeats 2 --budgets 400,900,1500 \
    --io-seconds 1 --cells mmap,defaults,off-overlap-od4,cache400-overlap-od4,cache900-overlap-od4,cache1500-overlap-od4,auto-overlap-od4 \
    --out $D/$name-70 > $D/$name-70.log 2>&1
done
uptime
