# $1 = request directory, $2 = request name (hex), $3 = a framed script: saved, private, as $1/$2, for
# `sh $1/$2` to run with its stdin free for data.
umask 077
mkdir -p -- "$1" || exit 1
printf '%s' "$3" > "$1/$2"
