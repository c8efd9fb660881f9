# $1 = release dir: one sha256 over its site/ tree, `site HEX`: the sha256 of the sorted (bytewise)
# `sha256sum` lines of every regular file outside __pycache__/ (Python writes those when it runs);
# `symlink PATH` instead if site/ holds a symlink, `missing` without site/.
rel=$1
[ -d "$rel/site" ] || { echo missing; exit 0; }
cd -- "$rel/site" || exit 1
l=$(find . -type l -print | head -n 1)
[ -z "$l" ] || { printf 'symlink %s\n' "$l"; exit 0; }
find . -name __pycache__ -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum -- \
  | sha256sum | { read -r h _; printf 'site %s\n' "$h"; }
