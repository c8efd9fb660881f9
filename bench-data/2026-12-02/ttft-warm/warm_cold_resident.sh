#!/usr/bin/env bash
# Issue 29: a 512-token prompt streamed with the pool warmed first (WARM=1: serve's idle steps), streamed cold, and
# resident, each engine in its own process, 3 rounds in this order; streamed under the TTFT cell's 40% cap and
# Pi 5 Gen 2 throttle. Output: warm-cold-resident.log (each line prefixed by its variant).
#   MODELS=/tmp/storage-models bench-data/2026-12-02/ttft-warm/warm_cold_resident.sh > warm-cold-resident.log
cd "$(dirname "$0")" && . ../../campaign.sh
P=../long-prompt-3/prompt_compute.py
M=$(q3g uniform)
for r in 1 2 3; do
  for v in warm cold resident; do
    case $v in
      warm) WARM=1 CAP_MIB=1107 BPS=430000000 "$PY" $P $M 512 --one stream 2>&1 | grep "^warm\|kind" | sed "s/^/$v /";;
      cold) CAP_MIB=1107 BPS=430000000 "$PY" $P $M 512 --one stream 2>/dev/null | sed "s/^/$v /";;
      resident) "$PY" $P $M 512 --one resident 2>/dev/null | sed "s/^/$v /";;
    esac
  done
done
