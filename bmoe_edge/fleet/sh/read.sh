# $1 = path: its content on stdout; exit 3 when it does not exist.
[ -e "$1" ] || exit 3
exec cat -- "$1"
