"""The fixed shell scripts deploy runs on a board (`sh -c SCRIPT sh ARGS...`): every path and name is
an argument, never part of the script text."""

from __future__ import annotations

PY_PROBE = ("import json, os, platform, sys; print('python=' + json.dumps({'machine': platform.machine(), "
             "'version': '%d.%d.%d' % sys.version_info[:3], 'glibc': os.confstr('CS_GNU_LIBC_VERSION') or ''}))")

# $1 sysroot default, $2 python (may contain {sysroot}), $3.. the exec wrapper (may contain {sysroot});
# $BMOE_EDGE_SYSROOT / $BMOE_EDGE_PYTHON override like in the launcher.
PROBE = r"""
printf 'uname=%s\n' "$(uname -m)"
printf 'getconf=%s\n' "$(getconf GNU_LIBC_VERSION 2>/dev/null)"
sysroot=${BMOE_EDGE_SYSROOT:-$1}
sub() {
  case $1 in *'{sysroot}'*) printf '%s' "${1%%\{sysroot\}*}$sysroot${1#*\{sysroot\}}";; *) printf '%s' "$1";; esac
}
python=${BMOE_EDGE_PYTHON:-$(sub "$2")}
code=$3
shift 3
n=$#
for w in "$@"; do set -- "$@" "$(sub "$w")"; done
shift "$n"
if [ $# -gt 0 ] && ! command -v "$1" >/dev/null 2>&1; then printf 'missing=%s\n' "$1"; exit 0; fi
case $python in
  */*) [ -x "$python" ] || { printf 'missing=%s\n' "$python"; exit 0; } ;;
  *) command -v "$python" >/dev/null 2>&1 || { printf 'missing=%s\n' "$python"; exit 0; } ;;
esac
"$@" "$python" -c "$code" 2>&1
printf 'python_rc=%s\n' "$?"
"""


# ---------------------------------------------------------------------------------------------------
# Remote scripts (fixed text; every path and name is an argument).

PREPARE = r"""
dir=$1; id=$2
mkdir -p -- "$dir/releases" || exit 10
[ ! -L "$dir/releases" ] || { echo "$dir/releases is a symlink" >&2; exit 11; }
t="$dir/releases/.write-test.$$"
( : > "$t" ) || exit 10
rm -f -- "$t"
printf 'avail_kb=%s\n' "$(df -Pk -- "$dir/releases" | awk 'NR==2 {print $4}')"
printf 'current=%s\n' "$(readlink -- "$dir/current" 2>/dev/null)"
cd -- "$dir/releases" || exit 10
for d in * .*.partial; do
  case $d in '*'|'.*.partial') continue;; esac
  [ -L "$d" ] && { printf 'symlink %s\n' "$d"; continue; }
  if [ -f "$d/.bmoe-release.json" ]; then
    printf 'release %s %s\n' "$d" "$(head -c 4096 -- "$d/.bmoe-release.json" | tr -d '\n')"
  elif [ -d "$d" ]; then printf 'other %s\n' "$d"; fi
done
"""

# $1 = base dir, then relative paths; prints "<index> <sha256>" or "<index> -" (missing / not a regular file)
HASH = r"""
base=$1; shift; i=0
for f in "$@"; do
  if [ -f "$base/$f" ] && [ ! -L "$base/$f" ]; then
    if h=$(sha256sum < "$base/$f"); then printf '%s %s\n' "$i" "${h%% *}"; else printf '%s !\n' "$i"; fi
  else printf '%s -\n' "$i"; fi
  i=$((i+1))
done
"""

# $1 = release dir: its symlinks (first one) and every non-directory outside site* (NUL-separated)
SCAN = r"""
rel=$1
l=$(find "$rel" -type l -print 2>/dev/null | head -n 1)
[ -z "$l" ] || { printf 'SYMLINK\0%s\0' "${l#"$rel"/}"; exit 0; }
cd -- "$rel" || exit 1
find . \( -path ./site -o -path './site.new.*' -o -path ./site.old \) -prune -o ! -type d -print0
"""

MKDIRS = r"""base=$1; shift; cd -- "$base" && mkdir -p -- "$@" """

COPY = r"""src=$1; dst=$2; shift 2; for f; do cp -p -- "$src/$f" "$dst/$f" || exit 1; done"""

REMOVE_IN = r"""base=$1; shift; cd -- "$base" || exit 0; for f; do rm -rf -- "./$f"; done"""

INSTALL = r"""
lock=$1; rel=$2
if command -v flock >/dev/null 2>&1; then
  exec flock "$lock" env BMOE_EDGE_RELEASE="$rel" "$rel/launcher/bmoe-edge.sh" --install-site
fi
exec env BMOE_EDGE_RELEASE="$rel" "$rel/launcher/bmoe-edge.sh" --install-site
"""

COMMIT = r"""
partial=$1; final=$2; cur=$3
if [ -e "$final" ] || [ -L "$final" ]; then
  [ "$cur" != "$final" ] || { echo "$final is current but incomplete" >&2; exit 12; }
  rm -rf -- "$final"
fi
mv -- "$partial" "$final"
"""

DEMOTE = r"""
final=$1; partial=$2
rm -rf -- "$partial"; rm -f -- "$final/.bmoe-release.json"; mv -- "$final" "$partial"
"""

SWITCH = r"""dir=$1; id=$2; cd -- "$dir" && ln -sfn -- "releases/$id" current.tmp && mv -T -- current.tmp current"""

# `sh -c HANGUP sh ARGV…`: run ARGV, and stop it (SIGTERM) when the SSH connection goes away — a
# Ctrl-C or a killed `generate --host` / `gates --host` does not leave it running on the board. The
# remote stdin stays open while the client lives (nothing is ever sent on it); `cat` sees EOF when the
# connection closes (it reads a copy of stdin: an asynchronous command's own stdin is /dev/null).
HANGUP = r"""
exec 3<&0
"$@" < /dev/null 3<&- &
pid=$!
( cat <&3 > /dev/null 2>&1; kill -TERM "$pid" 2>/dev/null ) > /dev/null 2>&1 &
exec 3<&-
watcher=$!
wait "$pid"
rc=$?
kill "$watcher" 2>/dev/null
exit "$rc"
"""

CONFIG_HOME = r"""printf '%s' "${XDG_CONFIG_HOME:-$HOME/.config}" """
