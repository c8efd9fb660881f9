"""A/B speed per round from turns.py's output, by the per-token p10 and by the runs' tok/s (median of the round's
runs): python turnsratio.py FILE..."""
import sys, statistics as st
for f in sys.argv[1:]:
    p10, run = {}, {}
    for line in open(f):
        p = line.split()
        if len(p) > 4 and p[3] == "p10":
            p10.setdefault((p[0], int(p[1])), []).append(float(p[4]))
            run.setdefault((p[0], int(p[1])), []).append(float(p[2]))
    n = max(r for _, r in p10) + 1
    by_p10 = [st.median(p10[("B", r)]) / st.median(p10[("A", r)]) for r in range(n) if ("B", r) in p10]
    by_run = [st.median(run[("A", r)]) / st.median(run[("B", r)]) for r in range(n) if ("B", r) in run]
    print(f, "\n  A/B by p10 ", [round(x, 3) for x in by_p10], "median", round(st.median(by_p10), 3),
          "\n  A/B by runs", [round(x, 3) for x in by_run], "median", round(st.median(by_run), 3))
