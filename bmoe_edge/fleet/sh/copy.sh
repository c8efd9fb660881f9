src=$1; dst=$2; shift 2; for f; do cp -p -- "$src/$f" "$dst/$f" || exit 1; done
