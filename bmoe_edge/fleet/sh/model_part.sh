# $1 = destination file, $2 = partial file, $3 = bytes to hash at its start: where a resumable model
# upload stands. Prints `dest <sha256|->` (the file there now), `part <size> <sha256 of its first $3
# bytes|->`. Creates the destination directory.
dest=$1; part=$2; n=$3
mkdir -p -- "$(dirname -- "$dest")" || exit 10
[ ! -d "$dest" ] || { echo "$dest is a directory" >&2; exit 11; }
if [ -f "$dest" ]; then printf 'dest %s\n' "$(sha256sum < "$dest" | cut -d' ' -f1)"; else echo 'dest -'; fi
if [ -f "$part" ]; then
  size=$(wc -c < "$part" | tr -d ' ')
  if [ "$n" -gt 0 ]; then h=$(head -c "$n" -- "$part" | sha256sum | cut -d' ' -f1); else h=-; fi
  printf 'part %s %s\n' "$size" "$h"
else echo 'part 0 -'; fi
