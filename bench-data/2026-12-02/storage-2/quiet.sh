#!/usr/bin/env bash
# Issue 31, the rest, on a quiet machine (no other engineer's builds or benchmarks): `defaults` against
# the physical limit at the Pi 5's Gen 3 class with the rpi5 profile (--board rpi5) and at Gen 2, beside
# the same cache at 1/2/3/4 lanes (tune picks 3 at Gen 2, 2 at Gen 3). The skewed 2.9 GB preset, 40% cap.
#   MODELS=/tmp/storage-models bench-data/2026-12-02/storage-2/quiet.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
CELLS=storage-check,resident,defaults,auto-overlap-od1,auto-overlap-od2,auto-overlap-od3,auto-overlap-od4
stream quiet-gen3-rpi5 -m "$(q3g skewed)" --ram-cap 40% --storage rpi5-nvme-gen3 --board rpi5 \
  --tokens 24 --repeats 2 --cells "$CELLS" --io-seconds 1 --long-prompts ""
stream quiet-gen2 -m "$(q3g skewed)" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --tokens 24 --repeats 2 --cells "$CELLS" --io-seconds 1 --long-prompts ""
