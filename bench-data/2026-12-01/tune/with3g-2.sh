#!/bin/bash
# tune -m the 3 GB preset again (quieter machine, current code), bench io of the same file right after
cd "$(dirname "$0")" && . ../../campaign.sh
M=/tmp/tune-bench/qwen3-30b-a3b-3g-Q4_0.gguf   # the 2.9 GB preset, qwen3-30b-a3b-3g Q4_0
stamp "tune -m 3g (2)"
s=$(date +%s)
XDG_CONFIG_HOME=/tmp/tune-xdg-3g2 "$BMOE" tune -m $M --json > /tmp/tune-data/tune-3g-2.json 2> /tmp/tune-data/tune-3g-2.err
echo "tune rc=$? wall $(( $(date +%s) - s )) s"
cp /tmp/tune-xdg-3g2/bmoe-edge/profiles/host.yaml /tmp/tune-data/tune-3g-2.yaml
stamp "bench io 3g"
"$BMOE" bench io -m $M --sizes 512k,1m,2m --lanes 1,2,3,4 --modes odirect --seconds 1 --repeats 3 --out /tmp/tune-data/io-3g-2 > /dev/null 2>&1
echo done $(date -u +%T)
