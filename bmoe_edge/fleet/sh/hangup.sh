# `hangup.sh ARGV…`: run ARGV, and stop it — and everything this command started — when the SSH
# connection goes away: a Ctrl-C or a killed `generate --host` / `gates --host` / deploy does not leave
# it running on the board. The remote stdin stays open while the client lives (nothing more is ever
# sent on it); `cat` sees EOF when the connection closes (it reads a copy of stdin: an asynchronous
# command's own stdin is /dev/null). sshd starts every command in a session of its own, so `kill 0`
# reaches exactly this command's processes.
exec 3<&0
"$@" < /dev/null 3<&- &
pid=$!
( cat <&3 > /dev/null 2>&1; kill -TERM 0 ) > /dev/null 2>&1 &
exec 3<&-
watcher=$!
wait "$pid"
rc=$?
kill "$watcher" 2>/dev/null
exit "$rc"
