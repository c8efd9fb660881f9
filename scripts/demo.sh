#!/usr/bin/env bash
# The main job on an embedded default, from a fresh machine: set-up (idempotent), then a tiny
# synthetic MoE model is generated and inspected by the freshly built engine.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
bin=.venv/bin/bmoe-edge
"$bin" --version
model=$("$bin" tiny-model --arch qwen3moe --quant Q8_0 -o "${BMOE_EDGE_CACHE:-$HOME/.cache/bmoe-edge}/demo/tiny-qwen3moe-q8_0.gguf" | tail -n 1)
"$bin" info "$model"
