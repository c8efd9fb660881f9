#!/usr/bin/env bash
# Issue 44's full HTTP fuzz: 5,000 requests, two seeds, --parallel 1 and 2, each followed by the connection
# campaign (20 rounds) on a fresh server. Two runs at a time on a 2-core machine (each server decodes on one
# thread). Writes <p>-<seed>/http-fuzz.{jsonl,md} beside this script and a log of each run.
set -uo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
here=$HERE
run() {  # parallel seed
  local out="$here/p$1-s$2"
  "$BMOE" fuzz --http --requests 5000 --seed "$2" --parallel "$1" --connection-rounds 20 \
    --workdir "/tmp/bmoe-http-fuzz-p$1-s$2" --out "$out" > "$out.log" 2>&1
  echo "p$1 s$2: exit $?" >> "$here/exits.txt"
}
: > "$here/exits.txt"
for seed in 44 45; do
  run 1 "$seed" & run 2 "$seed" & wait
done
