#!/usr/bin/env bash
# Issue 31's first "done when", on a quieter machine at the end: the Pi 5 Gen 2 class on the skewed 2.9 GB
# preset, `defaults` now the rpi5 profile's (2 lanes) beside this VM's 4-lane cache cell, and the check cell.
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
stream gen2-check -m "$(q3g skewed)" --ram-cap 40% --storage rpi5-nvme-gen2 --tokens 24 --repeats 2 \
  --cells defaults,auto-overlap-od4,auto-overlap-od4-pfauto,storage-check
