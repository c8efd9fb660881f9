#!/bin/bash
# more tuned/untuned generate pairs on the 3 GB preset, alternating order, the run record's settings kept
cd /work/wt-tune
M=/tmp/tune-bench/qwen3-30b-a3b-3g-Q4_0.gguf
gen() { # label xdg
  XDG_CONFIG_HOME=$2 .venv/bin/bmoe-edge generate -m $M -p "Once upon a time" -n 32 --json 2>/dev/null > /tmp/tune-data/gen.out
  python3 -c "
import json
rows=[json.loads(l) for l in open('/tmp/tune-data/gen.out')]
run=[r for r in rows if r['type']=='run'][0]; s=[r for r in rows if r['type']=='summary'][0]
print('$1', 'threads', run.get('threads'), 'io_threads', run['io_threads'], 'read_path', run.get('read_path'), 'cache_budget_mb', run['cache_budget_mb'], 'cache_margin_mb', run.get('cache_margin_mb'), 'decode_tok_s %.3f' % s['decode_tok_s'], 'cache_hit_pct %.1f' % s['cache_hit_pct'], 'load', open('/proc/loadavg').read().split()[0])
"
}
for r in 4 5 6 7; do
  if [ $((r % 2)) = 1 ]; then gen "untuned r$r" /tmp/empty-xdg; gen "tuned r$r" /tmp/tune-xdg-3g
  else gen "tuned r$r" /tmp/tune-xdg-3g; gen "untuned r$r" /tmp/empty-xdg; fi
done
echo done $(date -u +%T)
