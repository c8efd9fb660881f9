"""An offline replay of route traces against expert-cache policies: no model, no engine.

A trace (the engine's `--route-trace` CSV) gives every step's routed experts per layer and token; the
replay walks it as the streamer does: a layer's experts are looked up together (the step's union, each
read at most once), every routed expert is resident while the layer computes (the engine pins the layer
in flight), and then the layer keeps at most its share of experts, which ones the policy decides. So a
policy is only a choice of what stays: `keep(layer, step, counts)` after each layer's visit, with the
layer's resident set before it counting the hits.

The shares are the engine's (budget // one expert of every layer, the same count in every layer) unless
a `shares` list says otherwise (the cross-layer candidate). Policies:

- `lru`: the engine's (ExpertCache before issue 30): a step touches its experts in ascending id order,
  the least recent leave first; inside a step the order is the ids', so a union larger than the share
  keeps its highest ids.
- `lfu`: per-layer counts with exponential aging (a half-life in the layer's visits), the most
  frequent of what is resident stay; `lfu-mult` counts an expert once per sequence that routed it.
- `2q`: a probation FIFO (a quarter of the share) and a protected LRU; a second use, or a use after a
  recent eviction (a ghost list), protects.
- `arc`: adaptive replacement (recency and frequency lists with ghosts), fed a step's ids in order.
- `second-use`: LRU, but an expert not seen in the layer's recent history (a ghost list of the share's
  size) is the first to go: a one-off route does not push out a reused expert.
- `lru-mult`: LRU whose order inside a step is by how many sequences routed each expert.
- `static`: the share's most popular experts of the whole trace, fixed (hindsight).
- `belady`: the optimal choice (keep what is used again soonest; hindsight): the best any policy can do
  with these shares.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bmoe_edge.errors import BmoeError


@dataclass(frozen=True)
class Step:
    """One engine step: per layer, each token's routed ids."""

    layers: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def tokens(self) -> int:
        return len(self.layers[0]) if self.layers else 0

    def counts(self, layer: int) -> Counter[int]:
        """The layer's union, each expert with the number of tokens that routed to it. (The engine counts a
        prompt's batch once per sequence; a trace does not say which rows are one sequence's, so a replay
        counts its prompt steps by token: after a prompt of many tokens its cache can differ from the engine's.
        The traces in bench-data/2026-12-02/batching-cache have 4-token warm-ups and short prompts.)"""
        return Counter(e for row in self.layers[layer] for e in set(row))


@dataclass(frozen=True)
class Trace:
    steps: tuple[Step, ...]
    expert_bytes: tuple[int, ...]
    n_expert: int
    decode_from: int = 0     # the first step whose tokens are decodes (before: warm-up and prompts)

    @property
    def n_layer(self) -> int:
        return len(self.expert_bytes)


def read_steps(path: Path, n_layer: int, n_expert: int) -> tuple[Step, ...]:
    """The CSV's rows (step,pos,layer,experts,...) grouped by step, in file order."""
    steps: list[list[list[tuple[int, ...]]]] = []
    last: str | None = None
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not {"step", "layer", "experts"} <= set(reader.fieldnames or ()):
            raise ValueError("no step,layer,experts header")
        for line, row in enumerate(reader, start=2):
            layer, ids = int(row["layer"]), tuple(int(e) for e in row["experts"].split())
            if not 0 <= layer < n_layer or any(not 0 <= e < n_expert for e in ids):
                raise ValueError(f"line {line}: layer {layer} or an expert of {ids} is out of range")
            if row["step"] != last:
                steps.append([[] for _ in range(n_layer)])
                last = row["step"]
            steps[-1][layer].append(ids)
    if not steps:
        raise ValueError("no rows")
    return tuple(Step(tuple(tuple(rows) for rows in s)) for s in steps)


def read_trace(csv_path: Path) -> Trace:
    """A trace and its sidecar JSON (expert_bytes, n_expert, warmup_steps), as record_traces.py writes them.
    The first step after the warm-up is the clients' prompts; their decodes follow it."""
    try:
        meta = json.loads(csv_path.with_suffix(".json").read_text())
        sizes = tuple(int(b) for b in meta["expert_bytes"])
        n_expert = int(meta["n_expert"])
        steps = read_steps(csv_path, len(sizes), n_expert)
        return Trace(steps, sizes, n_expert, int(meta.get("warmup_steps", 0)) + 1)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # JSONDecodeError is a ValueError
        raise BmoeError(f"{csv_path}: not a route trace with its sidecar ({type(exc).__name__}: {exc})") from None


# --- policies -----------------------------------------------------------------------------------------


class Policy:
    """What stays of a layer after its visit. `resident` is read before `keep` for the hits."""

    name = "policy"

    def start(self, trace: Trace, shares: Sequence[int]) -> None:
        self.shares = list(shares)
        self.res: list[set[int]] = [set() for _ in shares]

    def resident(self, layer: int) -> set[int]:
        return self.res[layer]

    def keep(self, layer: int, step: int, counts: Counter[int]) -> None:
        raise NotImplementedError


class Lru(Policy):
    name = "lru"

    def __init__(self, order: str = "id") -> None:
        self.order = order
        if order == "mult":
            self.name = "lru-mult"

    def start(self, trace: Trace, shares: Sequence[int]) -> None:
        super().start(trace, shares)
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in shares]

    def keep(self, layer: int, step: int, counts: Counter[int]) -> None:
        lru = self.lru[layer]
        ids = sorted(counts) if self.order == "id" else sorted(counts, key=lambda e: (counts[e], e))
        for e in ids:   # the last touched is the most recent
            lru[e] = None
            lru.move_to_end(e)
        while len(lru) > self.shares[layer]:
            lru.popitem(last=False)
        self.res[layer] = set(lru)


class Lfu(Policy):
    """Counts that halve every `half_life` visits of the layer; the highest stay, the most recent on ties."""

    def __init__(self, half_life: float = 32.0, mult: bool = False) -> None:
        self.decay = 0.5 ** (1.0 / half_life) if half_life > 0 else 1.0
        self.mult = mult
        self.name = f"lfu{'-mult' if mult else ''}-h{half_life:g}"

    def start(self, trace: Trace, shares: Sequence[int]) -> None:
        super().start(trace, shares)
        self.score = [[0.0] * trace.n_expert for _ in shares]
        self.last = [[-1] * trace.n_expert for _ in shares]

    def keep(self, layer: int, step: int, counts: Counter[int]) -> None:
        score, last = self.score[layer], self.last[layer]
        for e in range(len(score)):
            score[e] *= self.decay
        for e, n in counts.items():
            score[e] += n if self.mult else 1
            last[e] = step
        pool = self.res[layer] | set(counts)
        ranked = sorted(pool, key=lambda e: (score[e], last[e], e), reverse=True)
        self.res[layer] = set(ranked[: self.shares[layer]])


class TwoQ(Policy):
    name = "2q"

    def start(self, trace: Trace, shares: Sequence[int]) -> None:
        super().start(trace, shares)
        self.a1: list[OrderedDict[int, None]] = [OrderedDict() for _ in shares]
        self.am: list[OrderedDict[int, None]] = [OrderedDict() for _ in shares]
        self.ghost: list[OrderedDict[int, None]] = [OrderedDict() for _ in shares]

    def keep(self, layer: int, step: int, counts: Counter[int]) -> None:
        a1, am, ghost, k = self.a1[layer], self.am[layer], self.ghost[layer], self.shares[layer]
        for e in sorted(counts):
            if e in am:
                am.move_to_end(e)
            elif e in a1 or e in ghost:
                a1.pop(e, None)
                ghost.pop(e, None)
                am[e] = None
            else:
                a1[e] = None
        k_in = max(1, k // 4)
        while len(a1) + len(am) > k:
            if len(a1) > k_in or not am:
                e, _ = a1.popitem(last=False)
                ghost[e] = None
                while len(ghost) > max(1, k // 2):
                    ghost.popitem(last=False)
            else:
                am.popitem(last=False)
        self.res[layer] = set(a1) | set(am)


class SecondUse(Policy):
    name = "second-use"

    def start(self, trace: Trace, shares: Sequence[int]) -> None:
        super().start(trace, shares)
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in shares]
        self.ghost: list[OrderedDict[int, None]] = [OrderedDict() for _ in shares]

    def keep(self, layer: int, step: int, counts: Counter[int]) -> None:
        lru, ghost, k = self.lru[layer], self.ghost[layer], self.shares[layer]
        new = [e for e in sorted(counts) if e not in lru and e not in ghost]
        for e in sorted(counts):
            ghost.pop(e, None)
            lru[e] = None
            lru.move_to_end(e)
        for e in new:   # first seen: the first to go, back to the ghosts
            if len(lru) <= k:
                break
            del lru[e]
            ghost[e] = None
        while len(lru) > k:
            e, _ = lru.popitem(last=False)
            ghost[e] = None
        while len(ghost) > max(1, k):
            ghost.popitem(last=False)
        self.res[layer] = set(lru)


class Arc(Policy):
    name = "arc"

    def start(self, trace: Trace, shares: Sequence[int]) -> None:
        super().start(trace, shares)
        n = len(shares)
        self.t1: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n)]
        self.t2: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n)]
        self.b1: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n)]
        self.b2: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n)]
        self.p = [0.0] * n

    def _replace(self, layer: int, in_b2: bool) -> None:
        t1, t2, b1, b2 = self.t1[layer], self.t2[layer], self.b1[layer], self.b2[layer]
        if t1 and (len(t1) > self.p[layer] or (in_b2 and len(t1) == self.p[layer]) or not t2):
            e, _ = t1.popitem(last=False)
            b1[e] = None
        elif t2:
            e, _ = t2.popitem(last=False)
            b2[e] = None

    def keep(self, layer: int, step: int, counts: Counter[int]) -> None:
        t1, t2, b1, b2, c = self.t1[layer], self.t2[layer], self.b1[layer], self.b2[layer], self.shares[layer]
        for e in sorted(counts):
            if e in t1 or e in t2:
                t1.pop(e, None)
                t2[e] = None
                t2.move_to_end(e)
            elif e in b1:
                self.p[layer] = min(c, self.p[layer] + max(1.0, len(b2) / max(1, len(b1))))
                self._replace(layer, False)
                del b1[e]
                t2[e] = None
            elif e in b2:
                self.p[layer] = max(0.0, self.p[layer] - max(1.0, len(b1) / max(1, len(b2))))
                self._replace(layer, True)
                del b2[e]
                t2[e] = None
            else:
                if len(t1) + len(b1) >= c and c > 0:
                    if len(t1) < c and b1:
                        b1.popitem(last=False)
                        self._replace(layer, False)
                    elif t1:
                        t1.popitem(last=False)
                elif len(t1) + len(t2) + len(b1) + len(b2) >= c:
                    if len(t1) + len(t2) + len(b1) + len(b2) >= 2 * c and b2:
                        b2.popitem(last=False)
                    if len(t1) + len(t2) >= c:
                        self._replace(layer, False)
                t1[e] = None
        while len(t1) + len(t2) > c:
            self._replace(layer, False)
        self.res[layer] = set(t1) | set(t2)


class Static(Policy):
    name = "static"

    def start(self, trace: Trace, shares: Sequence[int]) -> None:
        super().start(trace, shares)
        totals = [Counter[int]() for _ in shares]
        for s in trace.steps:
            for il in range(len(shares)):
                totals[il].update(s.counts(il).keys())
        self.hot = [{e for e, _ in totals[il].most_common(shares[il])} for il in range(len(shares))]

    def keep(self, layer: int, step: int, counts: Counter[int]) -> None:
        self.res[layer] = self.hot[layer]


class Belady(Policy):
    name = "belady"

    def start(self, trace: Trace, shares: Sequence[int]) -> None:
        super().start(trace, shares)
        # uses[layer][expert]: the steps that route to it, ascending
        self.uses = [[[] for _ in range(trace.n_expert)] for _ in shares]
        for i, s in enumerate(trace.steps):
            for il in range(len(shares)):
                for e in s.counts(il):
                    self.uses[il][e].append(i)

    def _next(self, layer: int, e: int, step: int) -> int:
        u = self.uses[layer][e]
        lo, hi = 0, len(u)
        while lo < hi:
            mid = (lo + hi) // 2
            if u[mid] <= step:
                lo = mid + 1
            else:
                hi = mid
        return u[lo] if lo < len(u) else 1 << 30

    def keep(self, layer: int, step: int, counts: Counter[int]) -> None:
        pool = self.res[layer] | set(counts)
        ranked = sorted(pool, key=lambda e: (self._next(layer, e, step), e))
        self.res[layer] = set(ranked[: self.shares[layer]])


class Native(Policy):
    """The engine's own ExpertCache through the bindings, called as the streamer calls it (a visit,
    then touch with the step's uses or insert in ascending order, then the trim): the replay checked
    against it. Its shares are its own (the ones given are not used)."""

    def __init__(self, factory: Callable[..., object], budget: int, ranking: str = "frequency") -> None:
        self.factory, self.budget, self.ranking = factory, budget, ranking
        self.name = f"engine-{ranking}"

    def start(self, trace: Trace, shares: Sequence[int]) -> None:
        super().start(trace, shares)
        self.cache = self.factory(self.budget, list(trace.expert_bytes), [trace.n_expert] * trace.n_layer,
                                  self.ranking)
        self.present: list[set[int]] = [set() for _ in shares]

    def resident(self, layer: int) -> set[int]:
        return self.present[layer]

    def keep(self, layer: int, step: int, counts: Counter[int]) -> None:
        c = self.cache
        c.visit(layer)  # type: ignore[attr-defined]
        for e in sorted(counts):
            if not c.touch(layer, e, counts[e]):  # type: ignore[attr-defined]
                c.insert(layer, e)  # type: ignore[attr-defined]
            self.present[layer].add(e)
        for il, e in c.evict_over_budget(-1):  # type: ignore[attr-defined]
            self.present[il].discard(e)


# --- replay -------------------------------------------------------------------------------------------


@dataclass
class Result:
    policy: str
    share: float                 # mean experts per layer
    lookups: int = 0             # decode steps: distinct experts a layer's step routed to
    hits: int = 0
    bytes_read: int = 0          # decode steps: misses x their expert bytes
    tokens: int = 0              # decoded tokens
    steps: int = 0
    routed_bytes: int = 0        # decode steps: the union's bytes (what no cache reads)
    summed_bytes: int = 0        # decode steps: every token's own routed bytes, summed
    per_layer_hits: list[int] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def mb_per_token(self) -> float:
        return self.bytes_read / self.tokens / 1e6 if self.tokens else 0.0

    @property
    def mb_per_step(self) -> float:
        return self.bytes_read / self.steps / 1e6 if self.steps else 0.0


def equal_shares(trace: Trace, budget_bytes: int) -> list[int]:
    """The engine's shares: one expert of every layer is a slot, the budget's slots in every layer."""
    slot = sum(trace.expert_bytes)
    n = budget_bytes // slot if slot else 0
    return [min(int(n), trace.n_expert) if b else 0 for b in trace.expert_bytes]


def filled_shares(trace: Trace, budget_bytes: int) -> list[int]:
    """The equal shares plus the budget's rest (less than a slot of every layer) as one more expert for
    the first layers it pays for: what a per-layer budget in whole experts leaves unused."""
    shares = equal_shares(trace, budget_bytes)
    left = budget_bytes - sum(n * b for n, b in zip(shares, trace.expert_bytes, strict=True))
    for il, b in enumerate(trace.expert_bytes):
        if b and b <= left and shares[il] < trace.n_expert:
            shares[il] += 1
            left -= b
    return shares


def value_shares(trace: Trace, budget_bytes: int) -> list[int]:
    """Cross-layer shares: the budget's bytes go, one expert at a time, to the layer whose next slot
    holds the most decode-step uses per byte (its popularity ranks, measured over the trace)."""
    counts = [Counter[int]() for _ in trace.expert_bytes]
    for s in trace.steps[trace.decode_from:]:
        for il in range(trace.n_layer):
            counts[il].update(s.counts(il).keys())
    ranked = [[n for _, n in c.most_common()] + [0] * trace.n_expert for c in counts]
    shares = [0] * trace.n_layer
    left = budget_bytes
    while True:
        best, value = -1, -1.0
        for il, b in enumerate(trace.expert_bytes):
            if b and b <= left and shares[il] < trace.n_expert and ranked[il][shares[il]] / b > value:
                best, value = il, ranked[il][shares[il]] / b
        if best < 0:
            return shares
        shares[best] += 1
        left -= trace.expert_bytes[best]


def replay(trace: Trace, policy: Policy, shares: Sequence[int]) -> Result:
    policy.start(trace, shares)
    layers = [il for il, b in enumerate(trace.expert_bytes) if b]
    r = Result(policy.name, sum(shares[il] for il in layers) / max(1, len(layers)),
               per_layer_hits=[0] * trace.n_layer)
    for i, s in enumerate(trace.steps):
        decode = i >= trace.decode_from
        if decode:
            r.steps += 1
            r.tokens += s.tokens
        for il in layers:
            counts = s.counts(il)
            if not counts:
                continue
            held = policy.resident(il)
            hits = sum(1 for e in counts if e in held)
            if decode:
                r.lookups += len(counts)
                r.hits += hits
                r.per_layer_hits[il] += hits
                r.bytes_read += (len(counts) - hits) * trace.expert_bytes[il]
                r.routed_bytes += len(counts) * trace.expert_bytes[il]
                r.summed_bytes += sum(len(set(row)) for row in s.layers[il]) * trace.expert_bytes[il]
            policy.keep(il, i, counts)
    return r


def candidates() -> list[Callable[[], Policy]]:
    """The policies the report compares, each made afresh for a replay."""
    return [Lru, lambda: Lru("mult"), lambda: Lfu(8), lambda: Lfu(32), lambda: Lfu(128),
            lambda: Lfu(32, mult=True), lambda: Lfu(0, mult=True), TwoQ, Arc, SecondUse, Static, Belady]


SHARES: dict[str, Callable[[Trace, int], list[int]]] = {"equal": equal_shares, "filled": filled_shares,
                                                        "value": value_shares}


def _row(label: str, budget: int, kind: str, r: Result) -> dict[str, object]:
    return {"trace": label, "budget_mib": round(budget / 2**20, 1), "shares": kind, "policy": r.policy,
            "share": round(r.share, 2), "hit_rate": round(r.hit_rate, 4), "mb_read_per_step": round(r.mb_per_step, 1),
            "mb_read_per_token": round(r.mb_per_token, 1),
            "union_over_summed": round(r.routed_bytes / r.summed_bytes, 3) if r.summed_bytes else 0.0,
            "decode_steps": r.steps, "tokens": r.tokens}


def report(traces: dict[str, Trace], budgets: Sequence[int],
           policies: Sequence[Callable[[], Policy]] | None = None) -> list[dict[str, object]]:
    """Every policy on every trace at every budget with the engine's equal shares; lru, lfu-mult, static
    and belady also with the budget's rest filled and with value shares (the cross-layer candidates)."""
    rows: list[dict[str, object]] = []
    for label, trace in traces.items():
        for budget in budgets:
            for make in policies or candidates():
                for kind, shares_of in SHARES.items():
                    p = make()
                    if kind != "equal" and not (p.name.startswith("lfu-mult") or p.name in ("lru", "belady", "static")):
                        continue
                    rows.append(_row(label, budget, kind, replay(trace, p, shares_of(trace, budget))))
            frequency, lru = engine_policies(budget)
            rows += [_row(label, budget, "engine", replay(trace, frequency, filled_shares(trace, budget))),
                     _row(label, budget, "engine", replay(trace, lru, equal_shares(trace, budget)))]
    return rows


def engine_policies(budget: int) -> list[Policy]:
    """The engine's ExpertCache itself, both rankings (its own shares), to check the replay against."""
    from bmoe_edge.engine import native

    factory = native.load().parts.ExpertCache
    return [Native(factory, budget, "frequency"), Native(factory, budget, "lru")]


def table(rows: Sequence[dict[str, object]]) -> str:
    keys = list(rows[0]) if rows else []
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(out) + "\n"


def run(paths: Sequence[Path], budgets_mib: Sequence[float], out: Path) -> list[dict[str, object]]:
    """`bench cache-sim`: the report of these traces (each with its .json sidecar) at these budgets, as
    cache-sim.csv and cache-sim.md in `out`."""
    traces = {p.stem: read_trace(p) for p in paths}
    rows = report(traces, [math.floor(b * 2**20) for b in budgets_mib])
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "cache-sim.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        w.writeheader()
        w.writerows(rows)
    (out / "cache-sim.md").write_text(table(rows))
    return rows
