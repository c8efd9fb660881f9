"""Each warm decode run's tok/s against what happened to the compute threads and the machine during it:
python perrun.py MODEL THREADS RUNS"""
import os, sys, time, statistics as st
from pathlib import Path
from bmoe_edge.engine import Engine
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "host-not-compaction" / "scripts"))
from full_cache import config  # session 26's engine settings, shared, not copied
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); runs = int(sys.argv[3])
pid = os.getpid()
def sched(tid):
    d = {}
    for line in open(f"/proc/{pid}/task/{tid}/sched"):
        if ":" in line:
            k, v = line.split(":", 1)
            try: d[k.strip()] = float(v.split()[0])
            except (ValueError, IndexError): pass
    cpu, wait, sl = map(int, open(f"/proc/{pid}/task/{tid}/schedstat").read().split())
    return (cpu / 1e6, wait / 1e6, d.get("se.nr_migrations", 0), d.get("nr_involuntary_switches", 0), d.get("nr_voluntary_switches", 0))
def cpus():
    out = []
    for l in open("/proc/stat"):
        if l.startswith("cpu") and l[3] != " ":
            f = list(map(int, l.split()[1:])); out.append(f)
    return out
def rep():
    return int(open("/sys/module/page_reporting/parameters/reported_kib").read())
def vm():
    d = dict(l.split() for l in open("/proc/vmstat")); return int(d["pgfault"]), int(d.get("pgfree", 0))
with Engine(model, config(model, t)) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    rows = []
    for r in range(runs):
        tids = os.listdir(f"/proc/{pid}/task")
        a = {x: sched(x) for x in tids}; c0 = cpus(); r0 = rep(); v0 = vm(); t0 = time.monotonic()
        g = e.run(PROMPT, 65)
        t1 = time.monotonic(); b = {x: sched(x) for x in tids}; c1 = cpus(); r1 = rep(); v1 = vm()
        d = g.metrics[1:]; ts = 1000 * len(d) / sum(m.wall_ms for m in d)
        busy = sorted(((b[x][0] - a[x][0], x) for x in tids), reverse=True)
        th = [tuple(round(b[x][i] - a[x][i], 1) for i in range(5)) for _, x in busy[:3]]
        sysd = [[c1[i][k] - c0[i][k] for k in range(8)] for i in range(len(c0))]
        # per cpu: user, system, idle, softirq, steal
        pc = " ".join(f"cpu{i}[u{s[0]} s{s[2]} i{s[3]} si{s[6]} st{s[7]}]" for i, s in enumerate(sysd))
        print(f"{r:2d} {ts:6.2f} tok/s prompt {g.metrics[0].wall_ms:6.1f}ms wall {t1-t0:.2f}s thr(cpu,wait,migr,invol,vol) {th} {pc} rep {r1-r0}KiB pgfault {v1[0]-v0[0]}", flush=True)
