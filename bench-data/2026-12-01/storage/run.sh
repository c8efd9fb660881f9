#!/usr/bin/env bash
# Issue 31's policy campaign: the engine's policies at four storage classes (microSD, Pi 5 NVMe Gen 2 and
# Gen 3, this machine's drive unthrottled), on the uniform and the skewed 2.9 GB presets at a 40% cap,
# 2 repeats, every cell's reads throttled to the class (bench stream --storage). Then the flagship's
# shape (17 GB) at Gen 2 and Gen 3 under a 6.5 GB cap (flagship.sh).
#   MODELS=/tmp/storage-models bench-data/2026-12-01/storage/run.sh [CLASS ...]
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
q3g uniform > /dev/null
q3g skewed > /dev/null
# The adaptive defaults and the simpler settings they must not lose to: cache off, two fixed budgets
# (half and all of what the 1161 MiB cap leaves), cache auto with 1/2/4 lanes, overlap off, read-ahead
# off/predict/auto; mmap and resident for the baseline and the physical limit; the storage check.
CELLS=resident,mmap,defaults,off-overlap-od4,cache410-overlap-od4,cache820-overlap-od4,auto-overlap-od4
CELLS=$CELLS,auto-overlap-od2,auto-overlap-od1,auto-serial-od4,auto-overlap-od4-predict,auto-overlap-od4-pfauto
CELLS=$CELLS,storage-check
# CLASS:PRESET pairs, in order (the skewed preset at every class first; the machine is shared, time is short).
for pair in ${@:-rpi5-nvme-gen2:skewed rpi5-nvme-gen3:skewed native:skewed microsd:skewed rpi5-nvme-gen2:uniform}; do
  class=${pair%%:*}; preset=${pair##*:}
  [ "$class" = "$pair" ] && preset=skewed  # a class alone: the skewed preset
  tokens=24; mmap_tokens=6
  [ "$class" = microsd ] && { tokens=10; mmap_tokens=3; }
  stream "$class-$preset" -m "$(q3g "$preset")" --ram-cap 40% --storage "$class" --tokens $tokens \
    --mmap-tokens $mmap_tokens --repeats 2 --budgets 410,820 --cells "$CELLS" --io-seconds 1
done
