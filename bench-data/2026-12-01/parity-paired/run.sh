#!/bin/sh
# Resident parity (issue 11's P1) measured two ways in the same campaign: the sequential cells
# (resident and fullcache-overlap, each its own process) and fullcache-paired (the resident model and
# the full cache in one process, stepped token by token in turn). Once with the machine as it is,
# once with its DAMON reclaimer (kdamond.0, a paddr `pageout` scheme) switched off and back on.
# Root only for the second half; run from a checkout with its venv, on an otherwise idle machine.
# OUT=DIR writes the records there instead of beside this script.
set -eu
cd "$(dirname "$0")" && . ../../campaign.sh
D=${OUT:-$HERE}
U=$BENCH/qwen3-30b-a3b-3g-Q4_0-skew0-v32k.gguf     # made by ../../2026-11-30/run-campaign.sh
K=/sys/kernel/mm/damon/admin/kdamonds/0/state
CELLS=resident,fullcache-overlap,fullcache-paired
stream "$D/damon-on" -m "$U" --ram-cap 40% --tokens 128 --repeats 6 --io-seconds 0 --cells $CELLS
if [ -w "$K" ] && [ "$(cat $K)" = on ]; then
  echo off > "$K"
  trap 'echo on > "$K"' EXIT
  stream "$D/damon-off" -m "$U" --ram-cap 40% --tokens 128 --repeats 4 --io-seconds 0 --cells $CELLS
fi
# probe_layout.py (probe-runs.txt): one paired run, then where each engine's pages physically are.
