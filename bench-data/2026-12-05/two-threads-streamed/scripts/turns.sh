# turns.sh ROUNDS "A args" "B args"
rm -f /tmp/diag/ready-*; echo -n none > /tmp/diag/turn
M=~/.cache/bmoe-edge/bench/qwen3-30b-a3b-3g-Q4_K-skew0.gguf
cd /work/main
.venv/bin/python -u /tmp/diag/turns.py $M ${T:-2} $2 A B $1 ${@:4} 2>/dev/null &
while [ ! -f /tmp/diag/ready-A ]; do sleep 1; done
.venv/bin/python -u /tmp/diag/turns.py $M ${T:-2} $3 B A $1 ${@:4} 2>/dev/null &
while [ ! -f /tmp/diag/ready-B ]; do sleep 1; done
echo -n A > /tmp/diag/turn
wait
