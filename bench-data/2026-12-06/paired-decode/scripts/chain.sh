#!/bin/bash
# This session's engine runs in one go (after the kernels campaign), outputs into ../runs/.
cd "$(dirname "$0")" && . ../../../campaign.sh
K=$BENCH/qwen3-30b-a3b-3g-Q4_K-skew0.gguf; Q=$BENCH/qwen3-30b-a3b-3g-Q4_0-skew0.gguf; R=../runs
MODE=stream $PY long.py $K 2 40 3 2>/dev/null > $R/long-q4k-stream.txt
MODE=resident $PY long.py $K 2 40 3 2>/dev/null > $R/long-q4k-resident.txt
MODE=stream $PY long.py $Q 2 40 2 2>/dev/null > $R/long-q40-stream.txt
$PY perrun.py $K 2 25 2>/dev/null > $R/perrun-q4k-stream.txt
$PY rest.py $K 2 8 8 2>/dev/null > $R/rest-q4k-stream.txt
# Then, taking turns (turns.sh copies nothing: it runs /tmp/diag/turns.py, a copy of its turns.py):
#   mkdir -p /tmp/diag && cp ../../../2026-12-05/two-threads-streamed/scripts/turns.py /tmp/diag/
#   bash ../../../2026-12-05/two-threads-streamed/scripts/turns.sh 8 stream resident > $R/turns-stream-vs-resident-q4k.txt
#   bash ../../../2026-12-05/two-threads-streamed/scripts/turns.sh 8 resident stream > $R/turns-resident-vs-stream-q4k.txt
#   python3 turnsratio.py $R/turns-*.txt
