#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up (idempotent), ruff, pytest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
.venv/bin/ruff check bmoe_edge tests
.venv/bin/python -m pytest -q "$@"
