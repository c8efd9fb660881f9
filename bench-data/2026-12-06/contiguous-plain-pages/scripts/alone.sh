# alone.sh N: N pairs of fresh processes, streamed then resident, each alone: 4 runs of 128 decodes
M=~/.cache/bmoe-edge/bench/qwen3-30b-a3b-3g-Q4_K-skew0.gguf
for i in $(seq $1); do for mode in stream resident; do
  rm -f /tmp/diag/ready
  .venv/bin/python -u /tmp/diag/loop.py $M ${T:-2} $mode 4 2>/dev/null | sed "s/^/$i $mode /"
done; done
