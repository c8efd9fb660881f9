# $1 final, $2 partial: a complete release that failed verification goes back to being a partial.
final=$1; partial=$2
rm -rf -- "$partial"; rm -f -- "$final/.bmoe-release.json" "$final/.bmoe-failed"; mv -- "$final" "$partial"
