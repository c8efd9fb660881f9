#!/usr/bin/env bash
# Issue 31, the rest (2026-12-02): `defaults` at the Pi 5's Gen 3 class with the rpi5 profile (2 lanes,
# read-ahead auto; `--board rpi5`), beside the same cache at 1/2/3/4 lanes and read-ahead auto paired
# with predict and with none; the skewed 2.9 GB preset, a 40% cap, 2 repeats.
#   MODELS=/tmp/storage-models bench-data/2026-12-02/storage-2/gen3-rpi5.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
CELLS=storage-check,resident,defaults,auto-overlap-od1,auto-overlap-od2,auto-overlap-od3,auto-overlap-od4
CELLS=$CELLS,pfauto-paired-predict,pfauto-paired-off
stream gen3-rpi5-skewed -m "$(q3g skewed)" --ram-cap 40% --storage rpi5-nvme-gen3 --board rpi5 \
  --tokens 24 --repeats 2 --cells "$CELLS" --io-seconds 1 --long-prompts ""
