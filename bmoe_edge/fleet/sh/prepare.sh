# What an install dir holds. $1 install dir, $2 "create" (make releases/, check it is writable) or "read".
# Prints avail_kb=, current=, then one line per entry of releases/: `release ID STAMP-JSON`,
# `failed ID` (a release marked failed), `symlink NAME`, `other NAME` (partials, strays).
dir=$1; mode=$2
if [ "$mode" = create ]; then
  mkdir -p -- "$dir/releases" || exit 10
  [ ! -L "$dir/releases" ] || { echo "$dir/releases is a symlink" >&2; exit 11; }
  t="$dir/releases/.write-test.$$"
  ( : > "$t" ) || exit 10
  rm -f -- "$t"
else
  [ -d "$dir/releases" ] || exit 0
fi
printf 'avail_kb=%s\n' "$(df -Pk -- "$dir/releases" | awk 'NR==2 {print $4}')"
printf 'current=%s\n' "$(readlink -- "$dir/current" 2>/dev/null)"
cd -- "$dir/releases" || exit 10
for d in * .*.partial; do
  case $d in '*'|'.*.partial') continue;; esac
  [ -L "$d" ] && { printf 'symlink %s\n' "$d"; continue; }
  if [ -f "$d/.bmoe-release.json" ]; then
    printf 'release %s %s\n' "$d" "$(head -c 4096 -- "$d/.bmoe-release.json" | tr -d '\n')"
    [ ! -f "$d/.bmoe-failed" ] || printf 'failed %s\n' "$d"
  elif [ -d "$d" ]; then printf 'other %s\n' "$d"; fi
done
