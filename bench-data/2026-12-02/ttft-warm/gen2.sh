#!/usr/bin/env bash
# Issue 29, after the pool is trimmed to the budget (not to nothing) and warmed before the prompt: decode after a 2,048-token
# prompt against after 16 tokens, same settings, 40% cap, at the Pi 5 NVMe Gen 2 class (where a decode is
# I/O-bound, so the ratio is readable), both presets, 2 repeats, 64 answer tokens. The before is
# ../long-prompt-3/gen2.sh (gen2-per-sequence-*-2048: same cells and settings).
#   MODELS=/tmp/storage-models [PREFIX=gen2] [PRESETS="skewed uniform"] bench-data/2026-12-02/ttft-warm/gen2.sh
# The same cells and settings as ../long-prompt-3/gen2.sh, run again after the change: that script's commands,
# sourced ($0 stays this script, so it runs in this folder and the outputs land here).
. "$(dirname "$0")/../long-prompt-3/gen2.sh"
