# Where requests and prompt files go: ${XDG_CACHE_HOME:-$HOME/.cache}/bmoe-edge/req (created, private).
d="${XDG_CACHE_HOME:-$HOME/.cache}/bmoe-edge/req"
umask 077
mkdir -p -- "$d" && chmod 700 -- "$d" && printf '%s\n' "$d"
