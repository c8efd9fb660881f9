#!/bin/bash
cd /work/wt-tune
M=/root/.cache/bmoe-edge/bench/tune-qwen3-30b-a3b-3g-2l-Q4_0.gguf
for i in 1 2; do
  echo "== bench io round $i $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  .venv/bin/bmoe-edge bench io -m $M --sizes 512k,1m,2m --lanes 1,2,4 --modes odirect --seconds 1 --repeats 3 --out /tmp/tune-data/io-$i 2>&1 | tail -15
  echo "== tune round $i $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  s=$(date +%s)
  XDG_CONFIG_HOME=/tmp/tune-xdg-$i .venv/bin/bmoe-edge tune --json > /tmp/tune-data/tune-$i.json 2> /tmp/tune-data/tune-$i.err
  echo "tune rc=$? wall $(( $(date +%s) - s )) s"
  cp /tmp/tune-xdg-$i/bmoe-edge/profiles/host.yaml /tmp/tune-data/tune-$i.yaml
done
echo done $(date -u +%T)
