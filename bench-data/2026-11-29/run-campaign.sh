#!/bin/sh
# The 2026-11-29 campaign, as run (then from the repository root, with the venv's bmoe-edge on PATH; now from
# anywhere: ../campaign.sh finds the checkout). Models are generated, never committed: they land in $BENCH.
# Token counts: 96 generated tokens per streamed/resident cell and 32 for the llama.cpp mmap cell
# (~2.3 s/token under the cap), 32 for the io-only replays: ~50 minutes for both models, 3 repeats.
set -eu
cd "$(dirname "$0")" && . ../campaign.sh
U=$(model "$BENCH/qwen3-30b-a3b-3g-Q4_0-skew0.gguf" $(q3g_args uniform))
S=$(model "$BENCH/qwen3-30b-a3b-3g-Q4_0-skew0.8.gguf" $(q3g_args skewed))
uptime
# Cross-check of bench io's Python lanes against fio (same file, slice size, O_DIRECT, cold).
if command -v fio >/dev/null; then
  for i in 1 2 3; do for nj in 1 4; do
    fio --name=slice --filename="$U" --readonly --rw=randread --bs=663552 --direct=1 --ioengine=psync \
        --numjobs=$nj --group_reporting --runtime=3 --time_based --randrepeat=0 \
        --output-format=terse --terse-version=3 | awk -F';' -v nj=$nj -v i=$i '{print i "," nj "," $7/1024}'
  done; done | (echo "repeat,numjobs,mib_s"; cat) > fio-crosscheck.csv
fi
stream uniform -m "$U" --ram-cap 40% --tokens 96 --mmap-tokens 32 --repeats 3 --budgets 193,386,772 \
  --routing-tokens 96
stream skewed -m "$S" --ram-cap 40% --tokens 96 --mmap-tokens 32 --repeats 3 --budgets 193,386,772 \
  --routing-tokens 96 --io-seconds 1 \
  --cells resident,mmap,off-serial-od4,off-overlap-od4,cache193-overlap-od4,cache386-overlap-od4,cache772-overlap-od4,cache772-serial-od4,auto-ceil-overlap-od4,fullcache-overlap,io-od4
uptime
# Supplementary (after the main campaign): larger budgets at 40%, and a 70% cap, on the uniform model.
stream uniform-budgets -m "$U" --ram-cap 40% --tokens 64 --mmap-tokens 32 --repeats 2 --budgets 772,850,900 \
  --io-seconds 1 --cells mmap,cache772-overlap-od4,cache850-overlap-od4,cache900-overlap-od4
stream uniform-cap70 -m "$U" --ram-cap 70% --tokens 64 --mmap-tokens 32 --repeats 2 --budgets 1600 \
  --io-seconds 1 --cells mmap,off-overlap-od4,cache1600-overlap-od4
