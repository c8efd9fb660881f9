#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up (idempotent), ruff, pytest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root"
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
.venv/bin/ruff check bmoe_edge tests
# One pytest worker per core, at most 4 (BMOE_EDGE_TEST_WORKERS=N to choose; 0 = none): most tests are one
# engine thread each. The tests that share the emulated board run in one worker (tests/conftest.py).
workers=${BMOE_EDGE_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}
if [[ $workers -gt 1 ]]; then
  set -- -n "$workers" --dist loadgroup "$@"
fi
.venv/bin/python -m pytest -q "$@"
