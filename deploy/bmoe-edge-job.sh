#!/bin/sh
# One headless generation job on the board (board: @BOARD@): what bmoe-edge-generate@<job>.service
# runs, and what you can run by hand:  <install_dir>/current/launcher/bmoe-edge-job.sh <job dir>
#
#   <job dir>/model        the gguf to run: its path on the board, one line
#   <job dir>/prompt.txt   the prompt, used verbatim (newlines included)
#   <job dir>/args         optional: more `bmoe-edge generate` arguments, one per line (e.g. -n, then 128)
#
# Output: <job dir>/out.jsonl (one JSON object per token, then the summary) and telemetry.csv, written
# under temporary names and renamed when the run succeeded. The board profile's engine defaults apply
# (--board @BOARD@, resolved from the release's own profile/).
set -eu
here=$(cd -P "$(dirname "$0")" && pwd)
release=${BMOE_EDGE_RELEASE:-$(dirname "$here")}
job=${1:?usage: bmoe-edge-job.sh JOB_DIR}
model=$(cat "$job/model")
set -- generate --board @BOARD@ -m "$model" --prompt-file "$job/prompt.txt" --json --csv "$job/telemetry.csv.new"
if [ -f "$job/args" ]; then
  while IFS= read -r arg || [ -n "$arg" ]; do set -- "$@" "$arg"; done < "$job/args"
fi
BMOE_EDGE_PROFILES="$release/profile${BMOE_EDGE_PROFILES:+:$BMOE_EDGE_PROFILES}"
export BMOE_EDGE_PROFILES
"$here/bmoe-edge.sh" "$@" > "$job/out.jsonl.new"
mv -f "$job/out.jsonl.new" "$job/out.jsonl"
mv -f "$job/telemetry.csv.new" "$job/telemetry.csv"
