#!/usr/bin/env bash
# Issue 29: does reading the drive at full speed (O_DIRECT, 4 MiB, in another process) slow a resident prompt's
# compute on this VM as much as a streamed prompt's reads slow its own? prompt_compute.py's resident engine,
# with dd reading the model file in a loop beside it the whole time; with BPS (bytes a second), dd's reads are
# throttled to it (blkio v1, as --storage throttles the engine's).
#   [BPS=430000000] bench-data/2026-12-02/long-prompt-3/reads_beside.sh MODEL.gguf
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
model=$1
if [[ -n "${BPS:-}" ]]; then
  dev=$(lsblk -no MAJ:MIN "$(df --output=source "$model" | tail -1)" | tr -d ' ')
  cg=$(read_throttle "reads-beside-$$" "${dev%%:*}:0" "$BPS")
fi
( [[ -n "${BPS:-}" ]] && echo $BASHPID > "$cg/cgroup.procs"
  while :; do dd if="$model" of=/dev/null bs=4M iflag=direct status=none; done ) &
reader=$!
trap 'kill $reader 2>/dev/null' EXIT
"$PY" prompt_compute.py "$model" 512 --one resident
