# $1 run dir (bench_start.sh), $2 byte offset: the run's log from that byte on, as it grows, until the run
# ends; then exit with its exit code. 124: the run stopped without an exit code (the board rebooted, a
# kill); 125: there is no such run.
run=$1
off=$2
[ -f "$run/log" ] || exit 125
while :; do
    ended=0
    [ -f "$run/exit" ] && ended=1
    size=$(($(wc -c < "$run/log")))
    if [ "$size" -gt "$off" ]; then
        tail -c +"$((off + 1))" "$run/log" | head -c "$((size - off))"
        off=$size
    fi
    if [ "$ended" = 1 ]; then
        exit "$(cat "$run/exit")"
    fi
    if ! kill -0 "$(cat "$run/pid" 2> /dev/null)" 2> /dev/null && [ ! -f "$run/exit" ]; then
        exit 124
    fi
    sleep 1
done
