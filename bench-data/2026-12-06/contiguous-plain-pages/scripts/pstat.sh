# pstat.sh MODE: perf stat (software + tracepoints) over 10 s of a warm decode loop
rm -f /tmp/diag/ready
.venv/bin/python -u /tmp/diag/loop.py ~/.cache/bmoe-edge/bench/qwen3-30b-a3b-3g-Q4_K-skew0.gguf 2 $1 6 > /tmp/diag/loop_$1.log 2>&1 &
while [ ! -f /tmp/diag/ready ]; do sleep 1; done; sleep 0.5; pid=$(cat /tmp/diag/ready)
perf stat -e task-clock,page-faults,context-switches,cpu-migrations,tlb:tlb_flush,irq_vectors:call_function_entry,irq_vectors:call_function_single_entry,irq_vectors:local_timer_entry,irq_vectors:reschedule_entry -p $pid -- sleep 10 2>&1 | tail -16
wait; cat /tmp/diag/loop_$1.log
