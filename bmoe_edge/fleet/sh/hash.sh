base=$1; shift; i=0
for f in "$@"; do
  if [ -f "$base/$f" ] && [ ! -L "$base/$f" ]; then
    if h=$(sha256sum < "$base/$f"); then printf '%s %s\n' "$i" "${h%% *}"; else printf '%s !\n' "$i"; fi
  else printf '%s -\n' "$i"; fi
  i=$((i+1))
done
