#!/usr/bin/env bash
# What `bmoe-edge tune` picks at each storage class: tune itself, run in a blkio child cgroup throttled to
# the class (the same files ramcap.throttle_reads writes), on the skewed 2.9 GB preset, its profile
# written under /tmp (never the user's). Its choices (io_threads, read_path, read_mb_s) go to tune-CLASS.json.
#   MODELS=/tmp/storage-models bench-data/2026-12-01/storage/tune_at.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
skewed=$(q3g skewed)
dev=$("$PY" -c 'import sys; from pathlib import Path
from bmoe_edge.bench.storage import block_device; print(block_device(Path(sys.argv[1])))' "$skewed")
for spec in ${@:-microsd:90000000:5000 rpi5-nvme-gen2:430000000:50000 rpi5-nvme-gen3:850000000:100000}; do
  IFS=: read -r name bps iops <<< "$spec"
  cg=$(read_throttle "storage-tune-$$-$name" "$dev" "$bps" "$iops")   # bps 0: no throttle
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
    "$BMOE" tune --board rpi5 -m "$skewed" --out "/tmp/storage-tune-$name.yaml" --json > "tune-$name.json" \
    || echo "tune at $name failed"
  rmdir "$cg" 2>/dev/null || true
done
