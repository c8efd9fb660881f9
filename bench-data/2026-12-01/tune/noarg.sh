#!/bin/bash
# Two rounds of `bench io` then `tune` without -m, alternating (README.md); the outputs went to /tmp/tune-data
# and were copied here (bench-io-N.csv, tune-N.*).
cd "$(dirname "$0")" && . ../../campaign.sh
M=$BENCH/tune-qwen3-30b-a3b-3g-2l-Q4_0.gguf    # tune's own compute model, written by the first tune
for i in 1 2; do
  stamp "bench io round $i"
  "$BMOE" bench io -m $M --sizes 512k,1m,2m --lanes 1,2,4 --modes odirect --seconds 1 --repeats 3 --out /tmp/tune-data/io-$i 2>&1 | tail -15
  stamp "tune round $i"
  s=$(date +%s)
  XDG_CONFIG_HOME=/tmp/tune-xdg-$i "$BMOE" tune --json > /tmp/tune-data/tune-$i.json 2> /tmp/tune-data/tune-$i.err
  echo "tune rc=$? wall $(( $(date +%s) - s )) s"
  cp /tmp/tune-xdg-$i/bmoe-edge/profiles/host.yaml /tmp/tune-data/tune-$i.yaml
done
echo done $(date -u +%T)
