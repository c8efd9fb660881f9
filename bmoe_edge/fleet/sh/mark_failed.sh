# $1 = release dir, $2 = why (one line): mark the release failed, so rollback never picks it.
printf '%s\n' "$2" > "$1/.bmoe-failed" && { sync -f -- "$1" 2>/dev/null || sync; }
