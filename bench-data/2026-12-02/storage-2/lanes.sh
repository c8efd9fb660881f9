#!/usr/bin/env bash
# Issue 31, the rest (2026-12-02): the lanes `tune` picks (tune_at.sh: 3 at Gen 2 and microSD) against
# 1/2/3/4 lanes of the same cache, and `defaults` (the rpi5 profile at Gen 2: 2 lanes; this machine's
# at microSD); at microSD also read-ahead auto paired with predict and with none. The skewed 2.9 GB
# preset, a 40% cap, 2 repeats.
#   MODELS=/tmp/storage-models bench-data/2026-12-02/storage-2/lanes.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
LANES=storage-check,resident,defaults,auto-overlap-od1,auto-overlap-od2,auto-overlap-od3,auto-overlap-od4
stream gen2-lanes-skewed -m "$(q3g skewed)" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --tokens 24 --repeats 2 --cells "$LANES" --io-seconds 1 --long-prompts ""
stream microsd-skewed -m "$(q3g skewed)" --ram-cap 40% --storage microsd \
  --tokens 24 --repeats 2 --cells "$LANES,pfauto-paired-predict,pfauto-paired-off" --io-seconds 1 \
  --long-prompts ""
