#!/bin/sh
# bmoe-edge launcher for one installed release (board: @BOARD@).
#
# `bmoe-edge build` renders this template into a bundle's launcher/ (the @...@ placeholders come from
# the board profile). The release layout it assumes (docs/boards.md, "Building for a board"):
#
#   <release>/manifest.json wheels/ launcher/ fixtures/ profile/      the bundle, as built
#   <release>/site/                                                    wheels/*.whl unpacked
#
# <release> is the directory above this script's own (symlinks resolved: running
# <install_dir>/current/launcher/bmoe-edge.sh runs the release `current` points at), or $BMOE_EDGE_RELEASE.
#
#   bmoe-edge.sh --install-site   unpack wheels/*.whl into <release>/site/ with the board's Python
#   bmoe-edge.sh ARGS...          python -m bmoe_edge ARGS... with PYTHONPATH=<release>/site
#
# Overrides: $BMOE_EDGE_PYTHON (the interpreter), $BMOE_EDGE_SYSROOT (emulated boards: where the
# exec wrapper finds the board's userland).
set -eu

here=$(cd -P "$(dirname "$0")" && pwd)
release=${BMOE_EDGE_RELEASE:-$(dirname "$here")}
sysroot=${BMOE_EDGE_SYSROOT:-@SYSROOT@}
python=${BMOE_EDGE_PYTHON:-@PYTHON@}
site="$release/site"
: "$sysroot"  # used by the exec wrapper of emulated boards

# The board's programs run through the profile's exec_wrapper (emulated boards) or directly.
# The release's board and its profile are this machine's defaults (`generate` with no knobs).
BMOE_EDGE_BOARD=@BOARD@
BMOE_EDGE_PROFILES="$release/profile${BMOE_EDGE_PROFILES:+:$BMOE_EDGE_PROFILES}"
BMOE_EDGE_SYSROOT=$sysroot  # for programs the release starts itself (rpc-worker's server)
export BMOE_EDGE_BOARD BMOE_EDGE_PROFILES BMOE_EDGE_SYSROOT
board_python() {
  PYTHONPATH="$site" PYTHONNOUSERSITE=1 PYTHONSAFEPATH=1 exec @EXEC_PREFIX@"$python" "$@"
}

if [ "${1-}" = "--install-site" ]; then
  tmp="$release/site.new.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  # One interpreter start for all wheels: under an emulator each start costs about a second.
  (board_python -c 'import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])' "$tmp" "$release"/wheels/*.whl) || { rm -rf "$tmp"; exit 1; }
  rm -rf "$release/site.old"
  if [ -d "$site" ]; then mv "$site" "$release/site.old"; fi
  mv "$tmp" "$site"
  rm -rf "$release/site.old"
  exit 0
fi

if [ ! -d "$site" ]; then
  echo "bmoe-edge: $site is missing: install the release first ($0 --install-site)" >&2
  exit 127
fi
board_python -m bmoe_edge "$@"
