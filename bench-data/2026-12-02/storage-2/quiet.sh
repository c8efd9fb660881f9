#!/usr/bin/env bash
# Issue 31, the rest, on a quiet machine (no other engineer's builds or benchmarks): `defaults` against
# the physical limit at the Pi 5's Gen 3 class with the rpi5 profile (--board rpi5) and at Gen 2, beside
# the same cache at 1/2/3/4 lanes (tune picks 3 at Gen 2, 2 at Gen 3). The skewed 2.9 GB preset, 40% cap.
#   MODELS=/tmp/storage-models docs/bench-data/2026-12-02/storage-2/quiet.sh
set -euo pipefail
cd "$(dirname "$0")"
BMOE=${BMOE:-../../../../.venv/bin/bmoe-edge}
MODELS=${MODELS:-/tmp/storage-models}
CELLS=storage-check,resident,defaults,auto-overlap-od1,auto-overlap-od2,auto-overlap-od3,auto-overlap-od4
$BMOE bench stream -m "$MODELS/q3g-skewed.gguf" --ram-cap 40% --storage rpi5-nvme-gen3 --board rpi5 \
  --tokens 24 --repeats 2 --cells "$CELLS" --io-seconds 1 --long-prompts "" --out quiet-gen3-rpi5 \
  > quiet-gen3-rpi5.log 2>&1 || echo "gen3 failed"
$BMOE bench stream -m "$MODELS/q3g-skewed.gguf" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --tokens 24 --repeats 2 --cells "$CELLS" --io-seconds 1 --long-prompts "" --out quiet-gen2 \
  > quiet-gen2.log 2>&1 || echo "gen2 failed"
