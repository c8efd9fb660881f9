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
