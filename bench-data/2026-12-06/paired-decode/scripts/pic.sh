#!/bin/bash
# llama-bench built as the engine builds llama.cpp (-fPIC) against the pin's own build, taking turns.
M=$1; T=$2; ROUNDS=$3  # the model, threads, rounds
A=$(ls ~/.cache/bmoe-edge/llama-bench/*/bin/llama-bench); B=/tmp/lbpic/bin/llama-bench  # B: cmake as llama_bench.SWITCHES plus -DCMAKE_POSITION_INDEPENDENT_CODE=ON
for r in $(seq $ROUNDS); do
  for name in nopic pic; do
    exe=$A; [ $name = pic ] && exe=$B
    v=$($exe -m $M -t $T -n 64 -p 0 -r 10 -fa 0 -d 6 -o json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin)[0]; print(f\"{d['avg_ts']:.2f} ({min(d['samples_ts']):.1f}-{max(d['samples_ts']):.1f})\")")
    echo "$r $name $v"
  done
done
