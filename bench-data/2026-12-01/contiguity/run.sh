#!/bin/sh
# The campaign after the contiguous page pool and the warm-up hint, as run from a checkout of the commit
# under test (a detached worktree) with its venv, on an otherwise idle machine: the quiet re-run's cells
# (../quiet-defaults) on both 3 GB presets at a 40% cap, the resident-parity cells, and the 2026-11-29
# system-CPU command under perf stat. OUT=DIR writes the records there instead of beside this script.
set -eu
cd "$(dirname "$0")" && . ../../campaign.sh
D=${OUT:-$HERE}
U=$BENCH/qwen3-30b-a3b-3g-Q4_0-skew0-v32k.gguf     # made by ../../2026-11-30/run-campaign.sh
S=$BENCH/qwen3-30b-a3b-3g-Q4_0-skew0.8-v32k.gguf
CELLS=mmap,defaults,auto-overlap-od4,off-overlap-od4,cache400-overlap-od4,cache600-overlap-od4
for m in skew0:$U skew0.8:$S; do
  name=${m%%:*}; model=${m#*:}
  uptime
  stream "$D/$name" -m "$model" --ram-cap 40% --tokens 64 --mmap-tokens 16 --repeats 2 \
    --io-seconds 0 --cells $CELLS --budgets 400,600
done
uptime
stream "$D/parity-skew0" -m "$U" --ram-cap 40% --tokens 128 --repeats 3 --io-seconds 0 \
  --cells resident,fullcache-overlap
mkdir -p "$D/perf"
for i in 1 2 3; do
  "$PY" -c "from pathlib import Path; from bmoe_edge.bench.machine import drop_page_cache; drop_page_cache(Path('$U'))"
  perf stat -o "$D/perf/perf-stat-od1-$i.txt" "$BMOE" generate -m "$U" -p "Once upon a time" -n 24 \
    --cache-mb 0 --io-threads 1 -t 1 --no-overlap --prefetch off --json > "$D/perf/generate-od1-$i.json"
done
uptime
