# The board lock of an install dir: one deploy, rollback or state write at a time. $1 install dir,
# $2 seconds to wait, $3 who takes it (one line, shown to a deploy that waits), $4 "auto" or "dir",
# $5 seconds of silence after which the holder is taken for gone (default 60).
# Prints `waiting OWNER` when another holds it, then `locked` once held (or exits 75: still busy after
# $2 s, 10: the install dir cannot be written). Held until this command's stdin ends (the connection
# closes or the client lets it go) — or until the client has sent no heartbeat line for $5 s: a client
# that vanished without closing its TCP connection (a power cut, a dropped link) would otherwise keep
# the board locked until the kernel gives up on the connection, hours later.
# With flock(1): a lock on <dir>/.lock, released by the kernel when the holder dies. Without it: a lock
# directory <dir>/.lock.d with the holder's pid (a dead holder's is taken over, by one waiter at a time:
# under <dir>/.lock.t, re-checked there, so two waiters never both take it).
dir=$1; wait_s=$2; owner=$3; how=$4; silence=${5:-60}
mkdir -p -- "$dir" || exit 10
hold() {
  alive="$dir/.lock.alive"
  printf '0\n' > "$alive" || exit 10
  me=$$
  ( last=; idle=0
    while sleep 1; do
      kill -0 "$me" 2>/dev/null || exit 0
      now=$(cat -- "$alive" 2>/dev/null)
      [ -n "$now" ] || continue    # caught between the writer's truncation and its write: a beat
      if [ "$now" = "$last" ]; then idle=$((idle + 1)); else idle=0; last=$now; fi
      [ "$idle" -lt "$silence" ] || { kill -TERM "$me"; exit 0; }
    done ) 9>&- </dev/null >/dev/null 2>&1 &
  watchdog=$!
  echo locked
  n=0
  while IFS= read -r _beat; do n=$((n + 1)); printf '%s\n' "$n" > "$alive"; done
  kill "$watchdog" 2>/dev/null
}
if [ "$how" != dir ] && command -v flock >/dev/null 2>&1; then
  ( : >> "$dir/.lock" ) || exit 10
  exec 9>>"$dir/.lock"
  if ! flock -n 9; then
    printf 'waiting %s\n' "$(head -c 300 -- "$dir/.lock.owner" 2>/dev/null | tr -d '\n')"
    flock -w "$wait_s" 9 || { printf 'busy %s\n' "$(head -c 300 -- "$dir/.lock.owner" 2>/dev/null | tr -d '\n')"; exit 75; }
  fi
  printf '%s\n' "$owner" > "$dir/.lock.owner"
  trap 'exit 1' HUP INT TERM
  hold
  exit 0
fi
ld="$dir/.lock.d"; lt="$dir/.lock.t"
waited=0
said=
while ! mkdir -- "$ld" 2>/dev/null; do
  [ -w "$dir" ] || { echo "$dir is not writable" >&2; exit 10; }
  pid=$(cat -- "$ld/pid" 2>/dev/null)
  stale=
  if [ -n "$pid" ]; then kill -0 "$pid" 2>/dev/null || stale=1
  elif [ -n "$(find "$ld" -prune -mmin +1 2>/dev/null)" ]; then stale=1    # its holder died before writing its pid
  fi
  if [ -n "$stale" ]; then
    if mkdir -- "$lt" 2>/dev/null; then
      # only the waiter holding .lock.t takes over, after looking again: another may have taken over
      # (and made a fresh .lock.d with a live pid) between our look and now
      again=$(cat -- "$ld/pid" 2>/dev/null)
      if [ "$again" = "$pid" ]; then rm -rf -- "$ld"; fi
      rmdir -- "$lt"
      continue
    fi
    if [ -n "$(find "$lt" -prune -mmin +1 2>/dev/null)" ]; then
      rmdir -- "$lt" 2>/dev/null; continue     # a waiter killed inside its takeover: its mark is stale
    fi
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
hold
