# turns.sh ROUNDS "A args" "B args"  (MA, MB: each process's model, default the Q4_K preset for both)
rm -f /tmp/diag/ready-*; echo -n none > /tmp/diag/turn
MA=${MA:-~/.cache/bmoe-edge/bench/qwen3-30b-a3b-3g-Q4_K-skew0.gguf}; MB=${MB:-$MA}
cd /work/main
.venv/bin/python -u /tmp/diag/turns.py $MA ${T:-2} $2 A B $1 ${@:4} 2>/dev/null &
while [ ! -f /tmp/diag/ready-A ]; do sleep 1; done
.venv/bin/python -u /tmp/diag/turns.py $MB ${T:-2} $3 B A $1 ${@:4} 2>/dev/null &
while [ ! -f /tmp/diag/ready-B ]; do sleep 1; done
echo -n A > /tmp/diag/turn
wait
