import sys, statistics as st
for f in sys.argv[1:]:
    d = {}
    for l in open(f):
        p = l.split()
        if len(p) > 4 and p[3] == "p10":
            d.setdefault((p[0], int(p[1])), []).append(float(p[4]))
    n = max(r for _, r in d) + 1
    rs = [st.median(d[("B", r)]) / st.median(d[("A", r)]) for r in range(n) if ("B", r) in d]
    print(f, "A/B speed (p10) per round", [round(x, 3) for x in rs], "median", round(st.median(rs), 3))
