#!/bin/sh
# Where the CPU goes: the resident engine (scripts/loop.py) against llama-bench, Q4_K, two threads, flash attention
# off, sampled by perf (no hardware counters on this VM: the cpu-clock). The engine's module is installed stripped;
# for this the same objects were linked once more without -Wl,-s into a copy put in its place, and the stripped one
# put back after (the link command: `ninja -t commands native/_native...so` in the build folder, less -Wl,-s).
# Then the layout of each process's weights (../../contiguous-plain-pages/scripts/layout.py).
cd "$(dirname "$0")" && . ../../../campaign.sh
M=$BENCH/qwen3-30b-a3b-3g-Q4_K-skew0.gguf
LB=$(ls -d "$HOME"/.cache/bmoe-edge/llama-bench/*/bin/llama-bench | head -1)
LAYOUT=../../contiguous-plain-pages/scripts/layout.py
"$PY" -u loop.py "$M" resident 25 > /tmp/loop.txt 2>&1 &
until grep -q READY /tmp/loop.txt 2>/dev/null; do sleep 1; done
perf record -F 1999 -g -p "$(pgrep -f loop.py | head -1)" -o /tmp/perf-res.data -- sleep 15
wait
perf record -F 1999 -g -o /tmp/perf-lb.data -- "$LB" -m "$M" -t 2 -r 12 --repack 1 -fa 0 -n 64 -p 0 -d 6
for f in res lb; do
  perf report -i /tmp/perf-$f.data --no-children --sort sym --stdio -g none | grep "%" | head -40 > ../runs/perf-$f-sym.txt
  perf report -i /tmp/perf-$f.data --no-children --sort pid,sym --stdio -g none | grep "%" | head -40 > ../runs/perf-$f-pid-sym.txt
done
"$PY" -u loop.py "$M" resident 8 > /tmp/loop.txt 2>&1 &
until grep -q READY /tmp/loop.txt 2>/dev/null; do sleep 1; done
python3 "$LAYOUT" "$(pgrep -f loop.py | head -1)"; wait
"$LB" -m "$M" -t 2 -r 20 --repack 1 -fa 0 -n 64 -p 0 -d 6 > /dev/null 2>&1 &
sleep 12; python3 "$LAYOUT" "$(pgrep -f bin/llama-bench | head -1)"; wait
