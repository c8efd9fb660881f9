# $1 = path, $2 = mode (octal), $3 = "durable" or "plain"; the content on stdin. Written under a
# temporary name and renamed over the path; durable: the file synced before the rename, the directory after.
path=$1; mode=$2; how=$3
tmp="$path.tmp.$$"
cat > "$tmp" || { rm -f -- "$tmp"; exit 1; }
chmod "$mode" "$tmp" || { rm -f -- "$tmp"; exit 1; }
if [ "$how" = durable ]; then sync -- "$tmp" 2>/dev/null || sync; fi
mv -f -- "$tmp" "$path" || { rm -f -- "$tmp"; exit 1; }
if [ "$how" = durable ]; then sync -f -- "$path" 2>/dev/null || sync; fi
