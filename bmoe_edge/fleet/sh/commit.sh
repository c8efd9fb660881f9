# $1 partial, $2 final, $3 current release dir (or ""): rename a checked partial into place, durably.
partial=$1; final=$2; cur=$3
if [ -e "$final" ] || [ -L "$final" ]; then
  [ "$cur" != "$final" ] || { echo "$final is current but incomplete" >&2; exit 12; }
  rm -rf -- "$final"
fi
sync -f -- "$partial" 2>/dev/null || sync
mv -- "$partial" "$final" || exit 1
sync -f -- "$final" 2>/dev/null || sync
