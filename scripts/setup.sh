#!/usr/bin/env bash
# Shared set-up for the README's commands: system packages (when root or sudo is available), a
# virtualenv in .venv, and the package built in place (ccache + a persistent build dir make a
# second run take seconds). Idempotent.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# command -> Debian package; only missing ones are installed.
declare -A needs=(
  [cc]=build-essential [c++]=build-essential [make]=build-essential [patch]=patch [git]=git
  [ccache]=ccache [file]=file [readelf]=binutils [dpkg-deb]=dpkg
  [aarch64-linux-gnu-gcc]=crossbuild-essential-arm64 [aarch64-linux-gnu-g++]=crossbuild-essential-arm64
  [qemu-aarch64]=qemu-user [ssh]=openssh-client [ssh-keygen]=openssh-client [/usr/sbin/sshd]=openssh-server
  [python3]=python3 [tmux]=tmux
  # tests/test_serve_ui.py: the chat page in a real browser (selenium, a dev dependency, drives it)
  [chromium]=chromium [chromedriver]=chromium-driver
)
missing=()
for tool in "${!needs[@]}"; do
  if [[ $tool == /* ]]; then [[ -e $tool ]] && continue; else command -v "$tool" >/dev/null && continue; fi
  missing+=("${needs[$tool]}")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
  || missing+=(python3-dev)
if ((${#missing[@]})); then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [[ $(id -u) == 0 ]]; then sudo=(); elif command -v sudo >/dev/null; then sudo=(sudo); else
    echo "error: missing system packages and no root/sudo: apt-get install -y ${missing[*]}" >&2; exit 1
  fi
  echo "installing system packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  # --no-install-recommends: qemu-user recommends qemu-user-binfmt, which is machine-wide.
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[[ -x .venv/bin/python ]] || python3 -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q cmake ninja 'scikit-build-core>=0.10' 'nanobind>=2.4' 2>&1 | grep -v '^WARNING: Location' || true

# ccache: share hits between clones (CI clones afresh) by hashing paths relative to the checkout.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
.venv/bin/python bmoe_edge/llama_source.py
echo "building bmoe-edge (first time: a few minutes; then seconds)"
# A test build: BMOE_TEST_FAULTS lets the tests inject faults through BMOE_FAULT (never in a bundle).
if ! .venv/bin/python -m pip install -q --no-build-isolation -C cmake.define.BMOE_TEST_FAULTS=ON \
    -e '.[host,dev]' > .venv/build.log 2>&1; then
  grep -v '^WARNING: Location' .venv/build.log | tail -40 >&2
  echo "error: the build failed; full log in .venv/build.log" >&2
  exit 1
fi
