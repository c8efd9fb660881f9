#!/usr/bin/env bash
# The main job on an embedded default, from a fresh machine: set-up (idempotent), then the edge tool end
# to end on the emulated board (qemu-arm64: an aarch64 Debian userland run by qemu-aarch64 with a
# Cortex-A76's ISA, reached over a real sshd on 127.0.0.1):
#   build its bundle -> start the board -> deploy with the gates run on the board -> generate text from
#   a tiny synthetic MoE (shipped in the bundle) there, experts streamed from disk, per-token telemetry
#   and the summary -> stop the board.
# A second run reuses every cache (build, sysroot, fixtures, the release already on the board).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
started=$(date +%s)
bin=.venv/bin/bmoe-edge
py=.venv/bin/python
lab=${BMOE_EDGE_CACHE:-$HOME/.cache/bmoe-edge}/demo/lab    # the board's keys, known_hosts, ssh_config
"$bin" --version

echo "== build: the qemu-arm64 bundle (cross-compiled for Cortex-A76, checked)"
"$bin" build --board qemu-arm64

echo "== start the emulated board (sshd on 127.0.0.1)"
host=$("$py" -m bmoe_edge.fleet.emulated_board start --lab "$lab" --name qemu-arm64)
trap '"$py" -m bmoe_edge.fleet.emulated_board stop --lab "$lab" --name qemu-arm64' EXIT
export BMOE_EDGE_SSH_CONFIG=$lab/ssh_config
echo "board: $host"

echo "== deploy, with the gates on the board before the switch"
"$bin" deploy --board qemu-arm64 --host "$host" --gates
"$bin" status --host "$host"

echo "== generate on the board: a tiny synthetic MoE, experts streamed, telemetry per token"
model=/tmp/bmoe-edge/qemu-arm64/current/fixtures/tiny-qwen3moe-Q8_0.gguf   # the profile's install dir
"$bin" generate --host "$host" -m "$model" -p "The quick brown fox jumps over the lazy dog. Once upon a time" \
  -n 16 --progress

echo "== done in $(( $(date +%s) - started )) s (after set-up); the board is stopped on exit"
