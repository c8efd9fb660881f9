# $1 install dir, $2 release id: make `current` point at releases/<id> atomically (one rename(2)),
# durably: the release's data is on disk before the switch, the directory entry after it.
dir=$1; id=$2
cd -- "$dir" || exit 1
[ -f "releases/$id/.bmoe-release.json" ] || { echo "releases/$id is not a complete release" >&2; exit 12; }
sync -f -- "releases/$id" 2>/dev/null || sync
ln -sfn -- "releases/$id" current.tmp || exit 1
mv -T -- current.tmp current || exit 1
sync -f -- . 2>/dev/null || sync
