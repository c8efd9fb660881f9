# $1 = stream|resident ; perf 8 s of the decode loop
rm -f /tmp/diag/ready
cd /work/main && (.venv/bin/python -u /tmp/diag/loop.py ~/.cache/bmoe-edge/bench/qwen3-30b-a3b-3g-Q4_K-skew0.gguf 2 $1 8 > /tmp/diag/loop-$1.out 2>/dev/null &)
while [ ! -f /tmp/diag/ready ]; do sleep 1; done; sleep 2
perf record -q -F 1999 -g -p $(cat /tmp/diag/ready) -o /tmp/diag/perf-$1.data -- sleep 8 2>/dev/null
sleep 12
perf report -i /tmp/diag/perf-$1.data --no-children --sort sym -q 2>/dev/null | grep -v "^$" | grep "%" | head -25 > /tmp/diag/perf-$1.txt
