# $1 = allowed_signers file, $2 = release dir: its manifest.json.sig must be a signature of its
# manifest.json by a key the board trusts (ssh-keygen -Y verify; the OpenSSH client is on the board).
allowed=$1; rel=$2
command -v ssh-keygen >/dev/null 2>&1 || { echo "ssh-keygen is missing on the board (install openssh-client)" >&2; exit 14; }
exec ssh-keygen -Y verify -f "$allowed" -I bmoe-edge -n bmoe-edge-bundle -s "$rel/manifest.json.sig" < "$rel/manifest.json"
