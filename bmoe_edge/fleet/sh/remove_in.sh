base=$1; shift; cd -- "$base" || exit 0; for f; do rm -rf -- "./$f"; done
