# $1 = allowed_signers file, $2 = release dir: its manifest.json.sig must be a signature of its
# manifest.json by a key the board trusts (ssh-keygen -Y verify; the OpenSSH client is on the board),
# and the signed manifest's bundle_id must be the release's own name (releases/<id> or
# releases/.<id>.partial): a genuine signed manifest of one bundle never vouches for another's files.
allowed=$1; rel=$2
command -v ssh-keygen >/dev/null 2>&1 || { echo "ssh-keygen is missing on the board (install openssh-client)" >&2; exit 14; }
ssh-keygen -Y verify -f "$allowed" -I bmoe-edge -n bmoe-edge-bundle -s "$rel/manifest.json.sig" < "$rel/manifest.json" || exit 1
name=${rel%/}; name=${name##*/}; name=${name#.}; name=${name%.partial}
# the manifest is written by bundle.write_manifest (2-space JSON): its one top-level bundle_id line
id=$(sed -n 's/^  "bundle_id": "\([^"\\]*\)",$/\1/p' "$rel/manifest.json")
[ "$id" = "$name" ] || { printf 'the signed manifest is bundle %s, not %s (the release directory): refusing it\n' "$(printf '%s' "$id" | head -c 80 | tr '\n' ' ')" "$name" >&2; exit 15; }
