# The board lock of an install dir: one deploy, rollback or state write at a time. $1 install dir,
# $2 seconds to wait, $3 who takes it (one line, shown to a deploy that waits), $4 "auto" or "dir".
# Prints `waiting OWNER` when another holds it, then `locked` once held (or exits 75: still busy after
# $2 s, 10: the install dir cannot be written). Held until this command's stdin ends (the connection
# closes or the client lets it go). With flock(1): a lock on <dir>/.lock, released by the kernel when
# the holder dies. Without it: a lock directory <dir>/.lock.d with the holder's pid (a dead holder's is
# taken over).
dir=$1; wait_s=$2; owner=$3; how=$4
mkdir -p -- "$dir" || exit 10
if [ "$how" != dir ] && command -v flock >/dev/null 2>&1; then
  ( : >> "$dir/.lock" ) || exit 10
  exec 9>>"$dir/.lock"
  if ! flock -n 9; then
    printf 'waiting %s\n' "$(head -c 300 -- "$dir/.lock.owner" 2>/dev/null | tr -d '\n')"
    flock -w "$wait_s" 9 || { printf 'busy %s\n' "$(head -c 300 -- "$dir/.lock.owner" 2>/dev/null | tr -d '\n')"; exit 75; }
  fi
  printf '%s\n' "$owner" > "$dir/.lock.owner"
  echo locked
  cat > /dev/null
  exit 0
fi
ld="$dir/.lock.d"
waited=0
said=
while ! mkdir -- "$ld" 2>/dev/null; do
  [ -w "$dir" ] || { echo "$dir is not writable" >&2; exit 10; }
  pid=$(cat -- "$ld/pid" 2>/dev/null)
  if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
    rm -rf -- "$ld"
    continue
  fi
  if [ -z "$said" ]; then printf 'waiting %s\n' "$(head -c 300 -- "$ld/owner" 2>/dev/null | tr -d '\n')"; said=1; fi
  if [ "$waited" -ge "$wait_s" ]; then
    printf 'busy %s\n' "$(head -c 300 -- "$ld/owner" 2>/dev/null | tr -d '\n')"; exit 75
  fi
  sleep 1
  waited=$((waited + 1))
done
trap 'rm -rf -- "$ld"' EXIT
trap 'exit 1' HUP INT TERM
printf '%s\n' "$$" > "$ld/pid"
printf '%s\n' "$owner" > "$ld/owner"
echo locked
cat > /dev/null
