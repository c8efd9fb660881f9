# $1 = partial file, $2 = its size to keep (bytes already verified), then stdin appended to it.
part=$1; keep=$2
if [ "$keep" = 0 ]; then : > "$part" || exit 1
else truncate -s "$keep" -- "$part" 2>/dev/null || { echo "cannot truncate $part" >&2; exit 1; }; fi
exec cat >> "$part"
