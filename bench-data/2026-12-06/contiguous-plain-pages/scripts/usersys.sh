# usersys.sh MODE: user and system CPU of a warm decode loop over 10 s, per thread
rm -f /tmp/diag/ready
cd /work/main
.venv/bin/python -u /tmp/diag/loop.py ~/.cache/bmoe-edge/bench/qwen3-30b-a3b-3g-Q4_K-skew0.gguf 2 $1 6 > /tmp/diag/loop_$1.log 2>&1 &
while [ ! -f /tmp/diag/ready ]; do sleep 1; done; sleep 0.5; pid=$(cat /tmp/diag/ready)
snap() { for t in /proc/$pid/task/*; do echo "$(basename $t) $(awk '{print $14, $15}' $t/stat) $(grep -E '^(voluntary|nonvoluntary)' $t/status | awk '{printf "%s ", $2}')"; done; }
snap > /tmp/diag/us_a; sleep 10; snap > /tmp/diag/us_b
join /tmp/diag/us_a /tmp/diag/us_b | awk -v m=$1 '{du=$6-$2; ds=$7-$3; if (du+ds>0) printf "%s tid %s user %d sys %d ticks, ctxsw vol %d invol %d\n", m, $1, du, ds, $8-$4, $9-$5}'
wait; cat /tmp/diag/loop_$1.log
