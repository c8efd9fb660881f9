# $1 run dir (bench_start.sh): its out/ directory as a tar stream on stdout.
[ -d "$1/out" ] || exit 3
cd -- "$1/out" && exec tar -cf - .
