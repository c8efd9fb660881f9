#!/bin/bash
# generate with the second tuned profile (io_threads 2) vs untuned, alternating; then -t 2 untuned vs auto
cd /work/wt-tune
M=/tmp/tune-bench/qwen3-30b-a3b-3g-Q4_0.gguf
gen() { # label xdg [extra args]
  XDG_CONFIG_HOME=$2 .venv/bin/bmoe-edge generate -m $M -p "Once upon a time" -n 32 --json ${@:3} 2>/dev/null > /tmp/tune-data/gen.out
  python3 -c "
import json
rows=[json.loads(l) for l in open('/tmp/tune-data/gen.out')]
run=[r for r in rows if r['type']=='run'][0]; s=[r for r in rows if r['type']=='summary'][0]
print('$1', 'threads', run.get('threads'), 'io_threads', run['io_threads'], 'read_path', run.get('read_path'), 'cache_budget_mb', run['cache_budget_mb'], 'decode_tok_s %.3f' % s['decode_tok_s'], 'cache_hit_pct %.1f' % s['cache_hit_pct'], 'load', open('/proc/loadavg').read().split()[0])
"
}
gen "untuned r1" /tmp/empty-xdg; gen "tuned2 r1" /tmp/tune-xdg-3g2
gen "tuned2 r2" /tmp/tune-xdg-3g2; gen "untuned r2" /tmp/empty-xdg
gen "untuned r3" /tmp/empty-xdg; gen "tuned2 r3" /tmp/tune-xdg-3g2
gen "untuned -t 2 r1" /tmp/empty-xdg -t 2; gen "untuned auto r4" /tmp/empty-xdg; gen "untuned -t 2 r2" /tmp/empty-xdg -t 2
echo done $(date -u +%T)
