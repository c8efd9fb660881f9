# $1 = directory; on stdin a tar stream of regular files with relative paths (written by the deploy
# itself from the bundle's manifest), unpacked into it with their modes and without their owners (-o).
# One stream for every file: one round trip for a whole bundle instead of two per file.
command -v tar >/dev/null 2>&1 || { echo "the board has no tar (busybox or GNU tar receives the bundle's files)" >&2; exit 127; }
exec tar -x -o -f - -C "$1"
