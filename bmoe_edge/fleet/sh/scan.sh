# $1 = release dir: its symlinks (first one) and every non-directory outside site* and the deploy's own
# marks (NUL-separated)
rel=$1
l=$(find "$rel" -type l -print 2>/dev/null | head -n 1)
[ -z "$l" ] || { printf 'SYMLINK\0%s\0' "${l#"$rel"/}"; exit 0; }
cd -- "$rel" || exit 1
find . \( -path ./site -o -path './site.new.*' -o -path ./site.old \) -prune -o ! -type d -print0
