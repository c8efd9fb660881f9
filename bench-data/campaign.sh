# bench-data/campaign.sh: what the campaign scripts beside the records share (POSIX sh), sourced by each:
#
#   cd "$(dirname "$0")" && . ../../campaign.sh     # a run's folder, bench-data/DATE/RUN/
#   cd "$(dirname "$0")" && . ../campaign.sh        # a date's folder, bench-data/DATE/
#
# A run's script keeps what is its own (its models, cells, settings, order, output names); what was run is
# that script read with this file. Outputs land beside the script: it runs in its own folder.
#
# Set here, unless given from outside:
#   ROOT    the checkout (the folder that holds bench-data/)
#   BMOE    the bmoe-edge that runs: the checkout's venv's
#   PY      the checkout's venv's python
#   MODELS  where the storage campaigns' models are written (models are generated, never committed)
#   BENCH   where `bmoe-edge tiny-model --preset` writes when given no -o

HERE=$(pwd)
case $HERE in
  */bench-data/*) ;;
  *) echo "campaign.sh: source it from a folder under bench-data/ (the script's own), not $HERE" >&2; exit 2 ;;
esac
ROOT=${ROOT:-${HERE%/bench-data/*}}
BMOE=${BMOE:-$ROOT/.venv/bin/bmoe-edge}
PY=${PY:-$ROOT/.venv/bin/python}
MODELS=${MODELS:-/tmp/storage-models}
BENCH=${BMOE_EDGE_CACHE:-$HOME/.cache/bmoe-edge}/bench

# q3g_args uniform|skewed: the 2.9 GB Qwen3-30B-A3B-shaped bench preset, uniform or skewed routing.
q3g_args() {
  case $1 in
    uniform) echo "--preset qwen3-30b-a3b-3g --routing-skew 0" ;;
    skewed) echo "--preset qwen3-30b-a3b-3g --routing-skew 0.8" ;;
    *) echo "q3g_args: uniform or skewed, not '$1'" >&2; return 2 ;;
  esac
}

# model PATH TINY_MODEL_ARGS...: PATH, written once by `bmoe-edge tiny-model ARGS -o PATH`.
model() {
  _path=$1; shift
  [ -f "$_path" ] || "$BMOE" tiny-model "$@" -o "$_path" >&2
  echo "$_path"
}

# q3g uniform|skewed: the preset in $MODELS (q3g-uniform.gguf, q3g-skewed.gguf), written once.
q3g() {
  # shellcheck disable=SC2046  # the preset's arguments, split on purpose
  model "$MODELS/q3g-$1.gguf" $(q3g_args "$1")
}

# stream OUT ARGS...: `bmoe-edge bench stream ARGS --out OUT`, its output in OUT.log; a failed run is said
# and the campaign goes on with the next.
stream() {
  _out=$1; shift
  "$BMOE" bench stream "$@" --out "$_out" > "$_out.log" 2>&1 || echo "$_out failed: see $_out.log"
}

# stamp TEXT...: a line for the campaign's log: TEXT, the time and the load average.
stamp() {
  echo "== $* $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
}

# run_line LABEL FIELD[:FORMAT]...: one line from a `generate --json` output on stdin: LABEL, each FIELD of
# the run record or the summary (a Python format spec after the colon), the load average.
run_line() {
  "$PY" "$ROOT/bench-data/campaign.py" run-line "$@"
}

# read_throttle NAME DEVICE BPS [IOPS]: a blkio (cgroup v1) child of this process's blkio cgroup whose reads
# from DEVICE (MAJ:MIN of a whole disk) are throttled to BPS bytes/s (and IOPS requests/s), as
# `bench stream --storage` throttles a cell's; prints its path. The caller moves processes in, and removes it.
read_throttle() {
  _cg=/sys/fs/cgroup/blkio$(awk -F: '$2 ~ /(^|,)blkio(,|$)/ {print $3}' /proc/self/cgroup)/$1
  mkdir -p "$_cg"
  echo "$2 $3" > "$_cg/blkio.throttle.read_bps_device"
  [ -z "${4:-}" ] || echo "$2 $4" > "$_cg/blkio.throttle.read_iops_device"
  echo "$_cg"
}
