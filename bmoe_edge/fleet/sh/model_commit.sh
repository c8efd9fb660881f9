# $1 = partial file, $2 = destination, $3 = expected sha256: verify, then replace the destination by
# rename (a running engine keeps reading the old file it has open), synced.
part=$1; dest=$2; want=$3
got=$(sha256sum < "$part" | cut -d' ' -f1) || exit 1
[ "$got" = "$want" ] || { rm -f -- "$part"; echo "sha256 $got, expected $want" >&2; exit 13; }
sync -- "$part" 2>/dev/null || sync
mv -f -- "$part" "$dest" || exit 1
sync -f -- "$dest" 2>/dev/null || sync
