# $1 = release dir (a partial): unpack its wheels into site/ with the release's own launcher.
# Runs under the deploy's board lock (no other installer runs), started through hangup.sh (it stops with
# the connection): what a killed install left behind (site.new.*) is removed first.
rel=$1
rm -rf -- "$rel"/site.new.* "$rel/site.old"
# exported, not `env K=V PATH`: env would take a release path holding a `=` for one more variable
BMOE_EDGE_RELEASE=$rel; export BMOE_EDGE_RELEASE
exec "$rel/launcher/bmoe-edge.sh" --install-site
