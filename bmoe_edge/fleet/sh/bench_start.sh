# $1 run id, then ARGV…: run `ARGV --out RUN/out` detached in RUN (${XDG_CACHE_HOME:-~/.cache}/bmoe-edge/bench/ID),
# in a session of its own and immune to SIGHUP, so a lost connection does not stop a campaign of hours. Its
# stderr (the progress lines) goes to RUN/log, its stdout to RUN/stdout, its exit code to RUN/exit when it
# ends (written under another name, then renamed: a reader never sees half of it). Prints RUN.
run="${XDG_CACHE_HOME:-$HOME/.cache}/bmoe-edge/bench/$1"
shift
mkdir -p -- "$run" || exit 1
: > "$run/log" || exit 1
detach=
command -v setsid > /dev/null 2>&1 && detach=setsid
$detach nohup sh -c 'run=$1; shift; "$@" --out "$run/out" > "$run/stdout" 2> "$run/log"; echo $? > "$run/exit.part"
mv -f -- "$run/exit.part" "$run/exit"' sh "$run" "$@" < /dev/null > /dev/null 2>&1 &
echo $! > "$run/pid"
printf '%s\n' "$run"
