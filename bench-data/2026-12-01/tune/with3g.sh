#!/bin/bash
cd /work/wt-tune
M=/tmp/tune-bench/qwen3-30b-a3b-3g-Q4_0.gguf
echo "== tune -m 3g $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
s=$(date +%s)
XDG_CONFIG_HOME=/tmp/tune-xdg-3g .venv/bin/bmoe-edge tune -m $M --json > /tmp/tune-data/tune-3g.json 2> /tmp/tune-data/tune-3g.err
echo "tune rc=$? wall $(( $(date +%s) - s )) s"
cp /tmp/tune-xdg-3g/bmoe-edge/profiles/host.yaml /tmp/tune-data/tune-3g.yaml
mkdir -p /tmp/empty-xdg
gen() { # label xdg
  XDG_CONFIG_HOME=$2 .venv/bin/bmoe-edge generate -m $M -p "Once upon a time" -n 32 --json 2>/dev/null > /tmp/tune-data/gen.out
  python3 -c "
import json,sys
rows=[json.loads(l) for l in open('/tmp/tune-data/gen.out')]
run=[r for r in rows if r['type']=='run'][0]; s=[r for r in rows if r['type']=='summary'][0]
print('$1', 'threads', run.get('threads'), 'io_threads', run['io_threads'], 'read_path', run.get('read_path'), 'decode_tok_s %.3f' % s['decode_tok_s'], 'prompt_ms %.0f' % s['prompt_ms'], 'cache_hit_pct', s['cache_hit_pct'], 'load', open('/proc/loadavg').read().split()[0])
"
}
gen warmup /tmp/empty-xdg
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then gen "untuned r$r" /tmp/empty-xdg; gen "tuned r$r" /tmp/tune-xdg-3g
  else gen "tuned r$r" /tmp/tune-xdg-3g; gen "untuned r$r" /tmp/empty-xdg; fi
done
echo done $(date -u +%T)
