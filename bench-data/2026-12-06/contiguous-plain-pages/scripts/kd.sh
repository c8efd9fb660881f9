# kd.sh MODE: kdamond CPU and scheme stats over 10 s of a warm decode loop
S=/sys/kernel/mm/damon/admin/kdamonds/0/contexts/0/schemes/0/stats
rm -f /tmp/diag/ready
.venv/bin/python -u /tmp/diag/loop.py ~/.cache/bmoe-edge/bench/qwen3-30b-a3b-3g-Q4_K-skew0.gguf 2 $1 6 > /tmp/diag/loop_$1.log 2>&1 &
while [ ! -f /tmp/diag/ready ]; do sleep 1; done; sleep 0.5
kp=$(cat /sys/kernel/mm/damon/admin/kdamonds/0/pid)
echo update_schemes_stats > /sys/kernel/mm/damon/admin/kdamonds/0/state
a=$(awk '{print $14+$15}' /proc/$kp/stat); s1=$(for f in nr_tried sz_tried nr_applied sz_applied qt_exceeds; do echo -n "$f=$(cat $S/$f) "; done)
sleep 10
echo update_schemes_stats > /sys/kernel/mm/damon/admin/kdamonds/0/state
b=$(awk '{print $14+$15}' /proc/$kp/stat); s2=$(for f in nr_tried sz_tried nr_applied sz_applied qt_exceeds; do echo -n "$f=$(cat $S/$f) "; done)
echo "$1 kdamond ticks in 10 s: $((b-a))"; echo " before $s1"; echo " after  $s2"
wait; cat /tmp/diag/loop_$1.log
