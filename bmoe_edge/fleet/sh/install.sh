# $1 = release dir (a partial): unpack its wheels into site/ with the release's own launcher.
# Runs under the deploy's board lock; started through hangup.sh, so it stops with the connection.
rel=$1
exec env BMOE_EDGE_RELEASE="$rel" "$rel/launcher/bmoe-edge.sh" --install-site
