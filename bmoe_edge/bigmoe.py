"""Large synthetic MoE models for benchmarking: real shapes, written tensor by tensor, shaped routing.

`bmoe-edge tiny-model --preset qwen3-30b-a3b-3g` writes a qwen3moe gguf with Qwen3-30B-A3B's
expert shape (64 experts, top-8, expert FF 768; d=1536 and 22 layers instead of d=2048 and 48, so
one Q4_0 slice is 663,552 B, ~350 MB of experts are routed per token and the file is ~2.9 GB).
The tensor rows come from `tinymoe.ROWS["qwen3moe"]`; only the dimensions, the embedding, the
router and the weight scales differ. The file is written with gguf's incremental API
(`add_tensor_info` for every tensor, then `write_tensor_data` one tensor at a time): at most one
tensor (one layer's gate, up or down experts, ~42 MB) is in memory at once.

Sizes: experts are ~131 MB per layer, so `--layers N` gives ~0.13 x N GB (the presets: 2g = 15
layers, 3g = 22, 6g = 44, 8g = 60). Quant types: Q4_0 (all weight matrices quantized from random
normals with `gguf.quants`), Q4_K (the experts as random Q4_K blocks — a valid encoding written
directly, since gguf.quants cannot quantize K-quants and llama.cpp's quantizer would need a
~20 GB F32 source; attention stays Q4_0; the slice size is the same 663,552 B), Q8_0.

Routing (`routing_skew`, `routing_repeat`):

- skew 0 and repeat 0 (the default): a random router. Every expert is equally likely and the
  previous token's experts come back at chance level (8/64 = 12.5%) — the worst case for any cache.
- otherwise the router is shaped. Router logits of expert j for a token of "cluster" g are built as
  `beta_j + C[g, j] + eps`, with `C ~ N(0, rho)` and `eps ~ N(0, 1 - rho)` per token:
  * beta (one per layer and expert) is fitted by Monte Carlo so that expert popularity follows Zipf:
    the expert of rank r (a random permutation per layer) is chosen with probability
    `min(1, lam * r**-skew)`, lam such that the probabilities add up to top-k (a single expert can be
    chosen at most once per token, so for large skews the top ranks saturate at 1);
  * clusters make routing repeat across neighbouring tokens the way real models do (consecutive
    tokens share a topic/domain, and domain-specialised experts dominate local routing consistency:
    Liang et al. 2025, "Not all models suit expert offloading"): the vocabulary is split into
    ROUTING_CLUSTERS clusters, and the generation chain (the bigram successor map below) stays in one
    cluster for a run of tokens of geometric length (mean ROUTING_RUN) before jumping to another.
    rho (the weight of the cluster term) is chosen by bisection so that the fraction of a token's
    experts that the previous token also routed to (same layer) is `routing_repeat` in simulation.
  The logit terms are realised geometrically: the token embedding is
  `a*u + b*c_g + s*n_t` (orthonormal shared direction u, cluster directions c_g, a token direction
  n_t orthogonal to both) and router row j is `(beta_j/a) u + sum_g (C[g,j]/b) c_g + noise row`, so
  that `router . rmsnorm(embedding)` is exactly the designed logit. Attention and expert outputs are
  scaled down (SUBLAYER_SCALE) so the residual stream stays close to the embedding over 22+ layers.
  The realised routing (what the engine actually reads) is measured by `bmoe-edge bench routing`.

The output matrix maps each token to a fixed successor (as tinymoe does), arranged as one cycle over
all normal tokens, so greedy generation never loops before visiting every token of the vocabulary
(a short loop would repeat the routing and flatter every cache).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bmoe_edge import tinymoe
from bmoe_edge.errors import BmoeError

ROUTING_CLUSTERS = 16
ROUTING_RUN = 8.0  # mean tokens the generation chain stays in one cluster
DEFAULT_REPEAT = 0.40  # previous-token expert reuse of a shaped router unless told otherwise
SUBLAYER_SCALE = 0.1  # attn_output and ffn_down_exps weights, relative to unit-variance outputs
EMB_SHARED = 0.3  # a: weight of the shared direction u in the embedding (shaped routers)
EMB_CLUSTER = 0.5  # b: weight of the cluster direction
DEFAULT_VOCAB = 4096
QUANTS = ("Q4_0", "Q4_K", "Q8_0")
_FILE_TYPE = {"Q4_0": 2, "Q8_0": 7, "Q4_K": 14}  # llama_ftype: MOSTLY_Q4_0, MOSTLY_Q8_0, MOSTLY_Q4_K_S


@dataclass(frozen=True)
class BigDims(tinymoe.Dims):
    n_expert: int = 64
    n_expert_used: int = 8

    def value(self, sym: str) -> int:
        if sym == "expert":
            return self.n_expert
        if sym == "expert_used":
            return self.n_expert_used
        return super().value(sym)


@dataclass(frozen=True)
class Preset:
    name: str
    arch: str
    dims: BigDims
    note: str


def _qwen3_a3b(n_layer: int) -> BigDims:
    # Qwen3-30B-A3B: 48 layers, d=2048, 128 experts, top-8, expert FF 768, 32/4 heads of 128.
    # Scaled: fewer layers, d=1536, 64 experts; the expert FF (the slice shape) is kept.
    return BigDims(n_layer=n_layer, n_embd=1536, n_ff=6144, n_ff_exp=768, n_head=12, n_head_kv=4,
                   n_expert=64, n_expert_used=8)


PRESETS: dict[str, Preset] = {
    f"qwen3-30b-a3b-{label}": Preset(f"qwen3-30b-a3b-{label}", "qwen3moe", _qwen3_a3b(n_layer),
                                     f"Qwen3-30B-A3B expert shape, {n_layer} layers, ~{label.upper()}B in Q4_0")
    for label, n_layer in (("2g", 15), ("3g", 22), ("6g", 44), ("8g", 60))
}


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise BmoeError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})") from None


def _type_size(quant: str) -> tuple[int, int]:
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[quant]]


def expert_slice_bytes(d: BigDims, quant: str) -> int:
    block, size = _type_size(quant)
    return d.n_embd * d.n_ff_exp // block * size


def estimate_bytes(d: BigDims, quant: str, vocab: int = DEFAULT_VOCAB) -> int:
    """About the file size: experts, attention (Q4_0), embeddings and output (Q8_0)."""
    q4_block, q4_size = _type_size("Q4_0")
    q8_block, q8_size = _type_size("Q8_0")
    experts = 3 * d.n_expert * expert_slice_bytes(d, quant)
    kv = d.n_head_kv * d.head_dim
    attn = (2 * d.n_embd * d.n_embd + 2 * d.n_embd * kv) // q4_block * q4_size
    router = 4 * d.n_embd * d.n_expert
    per_layer = experts + attn + router
    return d.n_layer * per_layer + 2 * vocab * d.n_embd // q8_block * q8_size


# ---------------------------------------------------------------------------------------------
# Routing design


@dataclass(frozen=True)
class RoutingPlan:
    skew: float
    repeat: float  # target previous-token reuse (simulation); 0 with skew 0 = random router
    rho: float  # weight of the cluster term
    shaped: bool
    sim_repeat: float  # what the simulation gives with rho
    sim_zipf: float  # Zipf exponent fitted to the simulated popularity

    @property
    def mode(self) -> str:
        return "shaped" if self.shaped else "random"


def zipf_targets(n_expert: int, k: int, skew: float) -> Any:
    """Per-rank selection probabilities min(1, lam * r^-skew) adding up to k (water-filling)."""
    import numpy as np

    w = np.arange(1, n_expert + 1, dtype=np.float64) ** -skew
    lo, hi = 0.0, float(k) / w[-1]
    for _ in range(200):
        lam = (lo + hi) / 2
        if np.minimum(1.0, lam * w).sum() > k:
            hi = lam
        else:
            lo = lam
    return np.minimum(1.0, lo * w)


def _topk_mask(logits: Any, k: int) -> Any:
    import numpy as np

    idx = np.argpartition(-logits, k - 1, axis=-1)[..., :k]
    mask = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(mask, idx, True, axis=-1)
    return mask


class _Sim:
    """Monte Carlo routing of one layer: tokens in clusters, pairs of neighbouring tokens."""

    def __init__(self, n_expert: int, k: int, rng: Any, samples: int = 8192) -> None:
        import numpy as np

        self.k = k
        self.g = rng.integers(0, ROUTING_CLUSTERS, samples)
        self.eps = rng.standard_normal((samples, n_expert))
        # The next token: same cluster with probability 1 - 1/RUN, else another one.
        jump = rng.random(samples) < 1.0 / ROUTING_RUN
        other = (self.g + rng.integers(1, ROUTING_CLUSTERS, samples)) % ROUTING_CLUSTERS
        self.g2 = np.where(jump, other, self.g)
        self.eps2 = rng.standard_normal((samples, n_expert))

    def logits(self, beta: Any, c: Any, rho: float, second: bool = False) -> Any:
        g, eps = (self.g2, self.eps2) if second else (self.g, self.eps)
        return beta[None, :] + c[g] + math.sqrt(1.0 - rho) * eps

    def fit_beta(self, target: Any, c: Any, rho: float, iters: int = 150, beta: Any = None) -> Any:
        import numpy as np

        beta = np.zeros(target.shape) if beta is None else beta.copy()
        goal = np.minimum(target, 0.995)
        for _ in range(iters):
            freq = _topk_mask(self.logits(beta, c, rho), self.k).mean(axis=0)
            beta += 0.7 * (np.log(goal) - np.log(np.clip(freq, 1e-4, 1.0)))
            beta -= beta.mean()
        return beta

    def repeat(self, beta: Any, c: Any, rho: float) -> float:
        a = _topk_mask(self.logits(beta, c, rho), self.k)
        b = _topk_mask(self.logits(beta, c, rho, second=True), self.k)
        return float((a & b).sum(axis=1).mean() / self.k)

    def popularity(self, beta: Any, c: Any, rho: float) -> Any:
        return _topk_mask(self.logits(beta, c, rho), self.k).mean(axis=0)


def fit_zipf(freq: Any) -> float:
    """Zipf exponent of a popularity vector: slope of log(share) vs log(rank), saturated ranks left out."""
    import numpy as np

    f = np.sort(np.asarray(freq, dtype=np.float64))[::-1]
    ranks = np.arange(1, len(f) + 1)
    keep = (f > 0) & (f < 0.99)  # selection probabilities of 1 are saturated (capped) ranks
    if keep.sum() < 3:
        keep = f > 0
    if keep.sum() < 3:
        return 0.0
    slope = np.polyfit(np.log(ranks[keep]), np.log(f[keep]), 1)[0]
    return float(-slope)


def plan_routing(d: BigDims, skew: float, repeat: float | None, seed: int = 0) -> RoutingPlan:
    import numpy as np

    if skew < 0 or skew > 4:
        raise BmoeError(f"routing skew must be between 0 and 4, got {skew}")
    if repeat is not None and not 0 <= repeat < 1:
        raise BmoeError(f"routing repeat must be in [0, 1), got {repeat}")
    if skew == 0 and not repeat:
        return RoutingPlan(0.0, 0.0, 0.0, False, d.n_expert_used / d.n_expert, 0.0)
    target_repeat = DEFAULT_REPEAT if repeat is None else repeat
    rng = np.random.default_rng([seed, 7])
    sim = _Sim(d.n_expert, d.n_expert_used, rng)
    target = zipf_targets(d.n_expert, d.n_expert_used, skew)
    c_unit = rng.standard_normal((ROUTING_CLUSTERS, d.n_expert))

    warm: list[Any] = [None]

    def reuse(rho: float) -> tuple[float, Any]:
        c = c_unit * math.sqrt(rho)
        beta = sim.fit_beta(target, c, rho, iters=80 if warm[0] is None else 25, beta=warm[0])
        warm[0] = beta
        return sim.repeat(beta, c, rho), beta

    lo, hi = 0.0, 0.98
    r_lo, beta = reuse(lo)
    rho = 0.0
    if r_lo < target_repeat:
        r_hi, _ = reuse(hi)
        warm[0] = beta
        if r_hi < target_repeat:
            raise BmoeError(f"routing repeat {target_repeat} is not reachable (at most {r_hi:.2f})")
        for _ in range(10):
            mid = (lo + hi) / 2
            r_mid, _ = reuse(mid)
            if r_mid < target_repeat:
                lo = mid
            else:
                hi = mid
        rho = (lo + hi) / 2
    c = c_unit * math.sqrt(rho)
    beta = sim.fit_beta(target, c, rho, beta=warm[0])
    return RoutingPlan(skew, target_repeat, rho, True, sim.repeat(beta, c, rho),
                       fit_zipf(sim.popularity(beta, c, rho)))


# ---------------------------------------------------------------------------------------------
# Geometry: embedding and router


@dataclass
class _Geometry:
    structure: Any  # (1 + G, d) orthonormal rows: u, then the cluster directions
    cluster_of: Any  # (n_vocab,) cluster of each token
    succ: Any  # (n_vocab,) successor of each token (normal tokens only are used)
    a: float
    b: float
    s: float


def _rng(seed: int, name: str) -> Any:
    import numpy as np

    return np.random.default_rng([seed, 0xB16, zlib.crc32(name.encode())])


def _orthogonal_rows(x: Any, structure: Any) -> Any:
    """Rows of x with the structure directions projected out, normalised to unit length."""
    import numpy as np

    x = x - (x @ structure.T) @ structure
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _geometry(d: BigDims, plan: RoutingPlan, seed: int) -> _Geometry:
    import numpy as np

    rng = _rng(seed, "geometry")
    q, _ = np.linalg.qr(rng.standard_normal((d.n_embd, 1 + ROUTING_CLUSTERS)))
    structure = q.T.copy()
    token_type = tinymoe._vocab()[1][: d.n_vocab]
    normal = np.flatnonzero(token_type == 1)
    # One cycle over all normal tokens, labelled with clusters in runs of geometric length.
    order = rng.permutation(normal)
    labels = np.empty(len(order), dtype=np.int64)
    i, g = 0, int(rng.integers(ROUTING_CLUSTERS))
    while i < len(order):
        run = int(rng.geometric(1.0 / ROUTING_RUN))
        labels[i:i + run] = g
        i += run
        g = (g + int(rng.integers(1, ROUTING_CLUSTERS))) % ROUTING_CLUSTERS
    cluster_of = rng.integers(0, ROUTING_CLUSTERS, d.n_vocab)
    cluster_of[order] = labels
    succ = np.arange(d.n_vocab)
    succ[order] = np.roll(order, -1)
    a, b = (EMB_SHARED, EMB_CLUSTER) if plan.shaped else (0.0, 0.0)
    return _Geometry(structure, cluster_of, succ, a, b, math.sqrt(1.0 - a * a - b * b))


def _embeddings(d: BigDims, geo: _Geometry, seed: int) -> tuple[Any, Any]:
    """token_embd (RMS EMBD_RMS) and output: output[succ[t]] is token t's embedding direction."""
    import numpy as np

    n = _orthogonal_rows(_rng(seed, "token_embd").standard_normal((d.n_vocab, d.n_embd)), geo.structure)
    unit = geo.s * n + geo.b * geo.structure[1 + geo.cluster_of] + geo.a * geo.structure[0][None, :]
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    base = unit * math.sqrt(d.n_embd)  # unit RMS rows
    tok_embd = (base * tinymoe.EMBD_RMS).astype(np.float32)
    out_scale = tinymoe.LOGIT_SCALE / math.sqrt(d.n_embd)
    rng = _rng(seed, "output")
    output = rng.standard_normal((d.n_vocab, d.n_embd)) * out_scale * 0.25
    token_type = tinymoe._vocab()[1][: d.n_vocab]
    normal = np.flatnonzero(token_type == 1)
    output[geo.succ[normal]] = base[normal] * out_scale
    return tok_embd, output.astype(np.float32)


def _router(d: BigDims, geo: _Geometry, plan: RoutingPlan, layer: int, seed: int) -> tuple[Any, Any]:
    """(router weight (n_expert, n_embd) float32, the designed per-expert selection probabilities)."""
    import numpy as np

    rng = _rng(seed, f"router.{layer}")
    noise = _orthogonal_rows(rng.standard_normal((d.n_expert, d.n_embd)), geo.structure)
    if not plan.shaped:
        w = noise  # logits ~ N(0, 1) for a unit-RMS input
        return w.astype(np.float32), np.full(d.n_expert, d.n_expert_used / d.n_expert)
    sim = _Sim(d.n_expert, d.n_expert_used, rng, samples=4096)
    ranks = rng.permutation(d.n_expert)  # expert -> rank - 1
    target = zipf_targets(d.n_expert, d.n_expert_used, plan.skew)[ranks]
    c = rng.standard_normal((ROUTING_CLUSTERS, d.n_expert)) * math.sqrt(plan.rho)
    beta = sim.fit_beta(target, c, plan.rho)
    # logit_j = w_j . x, x = sqrt(d) (a u + b c_g + s n_t): the terms come out as beta + C + eps.
    w = (beta[:, None] / geo.a) * geo.structure[0][None, :]
    w += (c.T / geo.b) @ geo.structure[1:]
    w /= math.sqrt(d.n_embd)
    w += noise * (math.sqrt(1.0 - plan.rho) / geo.s)  # noise . x = s sqrt(d) (noise . n_t) ~ N(0, s^2)
    return w.astype(np.float32), target


# ---------------------------------------------------------------------------------------------
# Tensors


@dataclass(frozen=True)
class _Spec:
    name: str
    shape: tuple[int, ...]  # numpy order
    qtype: str  # ggml type name
    make: Callable[[], Any]  # -> the array to write (float32 for F32, uint8 bytes otherwise)

    @property
    def nbytes(self) -> int:
        block, size = _type_size(self.qtype)
        n = 1
        for s in self.shape:
            n *= s
        return n // block * size

    @property
    def byte_shape(self) -> tuple[int, ...]:
        block, size = _type_size(self.qtype)
        return (*self.shape[:-1], self.shape[-1] // block * size)


def _quantize(x: Any, qtype: str) -> Any:
    import gguf

    if qtype == "F32":
        return x.astype("float32")
    return gguf.quants.quantize(x.astype("float32"), gguf.GGMLQuantizationType[qtype])


def _gaussian(seed: int, name: str, shape: tuple[int, ...], scale: float, qtype: str) -> Any:
    rng = _rng(seed, name)
    return _quantize(rng.standard_normal(shape, dtype="float32") * scale, qtype)


def _random_q4_k(rng: Any, n_blocks: int, std: float) -> Any:
    """Random Q4_K blocks: per 32-weight sub-block w = d*sc*q - dmin*m with sc = m = 32, q uniform
    in 0..15 and dmin = 7.5 d, so weights are zero-mean with the given standard deviation."""
    import numpy as np

    blocks = np.empty((n_blocks, 144), dtype=np.uint8)
    dd = std / (32 * math.sqrt((16 * 16 - 1) / 12))
    blocks[:, 0:2] = np.frombuffer(np.float16(dd).tobytes(), dtype=np.uint8)
    blocks[:, 2:4] = np.frombuffer(np.float16(7.5 * dd).tobytes(), dtype=np.uint8)
    # scales[12]: sc_j, m_j = 32 for j = 0..7 (6-bit: low bits in bytes 0-7, the high pair for j >= 4
    # in the top bits of bytes 0-7, the low nibbles of j >= 4 in bytes 8-11).
    sc = m = 32
    scales = np.zeros(12, dtype=np.uint8)
    for j in range(4):
        scales[j] = (sc & 63) | ((sc >> 4) << 6)
        scales[j + 4] = (m & 63) | ((m >> 4) << 6)
        scales[j + 8] = (sc & 0xF) | ((m & 0xF) << 4)
    blocks[:, 4:16] = scales
    blocks[:, 16:] = rng.integers(0, 256, (n_blocks, 128), dtype=np.uint8)
    return blocks


def _experts(seed: int, name: str, d: BigDims, ne0: int, ne1: int, scale: float, qtype: str) -> Any:
    """(n_expert, ne1, ne0) weights, one expert at a time; bytes."""
    import numpy as np

    block, size = _type_size(qtype)
    out = np.empty((d.n_expert, ne1, ne0 // block * size), dtype=np.uint8)
    rng = _rng(seed, name)
    std = scale / math.sqrt(ne0)
    for e in range(d.n_expert):
        if qtype == "Q4_K":
            out[e] = _random_q4_k(rng, ne1 * ne0 // block, std).reshape(ne1, -1)
        else:
            out[e] = _quantize(rng.standard_normal((ne1, ne0), dtype=np.float32) * np.float32(std), qtype)
    return out


def _specs(d: BigDims, quant: str, plan: RoutingPlan, seed: int,
           designed: dict[int, Any]) -> Iterator[_Spec]:
    """Every tensor of the model in file order, each made only when written."""
    row = tinymoe.ROWS["qwen3moe"]
    dense_q = "Q4_0" if quant == "Q4_K" else quant
    geo = _geometry(d, plan, seed)
    emb: dict[str, Any] = {}

    def embedding(which: str) -> Any:
        if not emb:
            tok, out = _embeddings(d, geo, seed)
            emb["token_embd"], emb["output"] = _quantize(tok, "Q8_0"), _quantize(out, "Q8_0")
        return emb.pop(which)

    yield _Spec("token_embd.weight", (d.n_vocab, d.n_embd), "Q8_0", lambda: embedding("token_embd"))
    for il in range(d.n_layer):
        for t in row.layer:
            name = f"blk.{il}.{t.name}"
            ne = tuple(d.value(s) for s in t.ne)
            shape = tuple(reversed(ne))
            suffix = t.name.removesuffix(".weight")
            if t.init == "norm":
                yield _Spec(name, shape, "F32", lambda shape=shape: _ones(shape))
            elif suffix == "ffn_gate_inp":
                def router(il: int = il) -> Any:
                    w, target = _router(d, geo, plan, il, seed)
                    designed[il] = target
                    return w
                yield _Spec(name, shape, "F32", router)
            elif suffix in row.experts:
                scale = SUBLAYER_SCALE if suffix == "ffn_down_exps" else 1.0
                yield _Spec(name, shape, quant,
                            lambda name=name, ne=ne, scale=scale: _experts(seed, name, d, ne[0], ne[1], scale, quant))
            else:
                scale = (SUBLAYER_SCALE if suffix == "attn_output" else 1.0) / math.sqrt(ne[0])
                yield _Spec(name, shape, dense_q,
                            lambda name=name, shape=shape, scale=scale: _gaussian(seed, name, shape, scale, dense_q))
    yield _Spec("output_norm.weight", (d.n_embd,), "F32", lambda: _ones((d.n_embd,)))
    yield _Spec("output.weight", (d.n_vocab, d.n_embd), "Q8_0", lambda: embedding("output"))


def _ones(shape: tuple[int, ...]) -> Any:
    import numpy as np

    return np.ones(shape, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# Writing


def _kvs(d: BigDims, quant: str, name: str, plan: RoutingPlan) -> list[tinymoe._KV]:
    import gguf

    VT = gguf.GGUFValueType
    row = tinymoe.ROWS["qwen3moe"]
    kvs = [
        tinymoe._KV("general.name", f"bmoe-bench-{name}-{quant}", VT.STRING),
        tinymoe._KV("general.file_type", _FILE_TYPE[quant], VT.UINT32),
        tinymoe._KV("general.quantization_version", gguf.GGML_QUANT_VERSION, VT.UINT32),
        tinymoe._KV("bmoe.synthetic.preset", name, VT.STRING),
        tinymoe._KV("bmoe.routing.mode", plan.mode, VT.STRING),
        tinymoe._KV("bmoe.routing.skew", float(plan.skew), VT.FLOAT32),
        tinymoe._KV("bmoe.routing.repeat", float(plan.repeat), VT.FLOAT32),
        tinymoe._KV("bmoe.routing.rho", float(plan.rho), VT.FLOAT32),
        tinymoe._KV("bmoe.routing.clusters", ROUTING_CLUSTERS if plan.shaped else 0, VT.UINT32),
        tinymoe._KV("bmoe.routing.run_length", float(ROUTING_RUN), VT.FLOAT32),
        tinymoe._KV("bmoe.routing.sim_repeat", float(plan.sim_repeat), VT.FLOAT32),
        tinymoe._KV("bmoe.routing.sim_zipf", float(plan.sim_zipf), VT.FLOAT32),
    ]
    base = (
        tinymoe.Key("context_length", 4096),
        tinymoe.Key("embedding_length", "embd"),
        tinymoe.Key("block_count", "layer"),
        tinymoe.Key("attention.head_count", "head"),
        tinymoe.Key("attention.head_count_kv", "head_kv"),
        tinymoe.Key("attention.layer_norm_rms_epsilon", 1e-6, "f32"),
        tinymoe.Key("rope.freq_base", 10000.0, "f32"),
    )
    for key in (*base, *row.keys):
        value = key.value
        if key.kind == "u32":
            kvs.append(tinymoe._KV(f"{row.arch}.{key.name}", d.value(value) if isinstance(value, str) else int(value),
                                   VT.UINT32))
        elif key.kind == "f32":
            kvs.append(tinymoe._KV(f"{row.arch}.{key.name}", float(value), VT.FLOAT32))
        else:
            raise AssertionError(key.kind)
    kvs.extend(tinymoe._vocab_kvs(d.n_vocab))
    return kvs


@dataclass(frozen=True)
class Written:
    path: Path
    bytes: int
    preset: str
    quant: str
    plan: RoutingPlan
    dims: BigDims


def resolve_dims(preset_name: str, quant: str, *, n_layer: int | None = None,
                 vocab_size: int | None = None) -> BigDims:
    p = preset(preset_name)
    if quant not in QUANTS:
        raise BmoeError(f"preset models are written in {', '.join(QUANTS)}, not {quant!r}")
    d = p.dims
    if n_layer is not None:
        if n_layer < 1:
            raise BmoeError(f"--layers must be at least 1, got {n_layer}")
        d = replace(d, n_layer=n_layer)
    n_full = tinymoe.full_vocab_size()
    vocab = vocab_size or min(DEFAULT_VOCAB, n_full)
    if not tinymoe.MIN_VOCAB <= vocab <= n_full:
        raise BmoeError(f"vocab_size must be between {tinymoe.MIN_VOCAB} and {n_full}, got {vocab}")
    return replace(d, n_vocab=vocab)


def write_preset(path: Path, preset_name: str, quant: str = "Q4_0", *, routing_skew: float = 0.0,
                 routing_repeat: float | None = None, seed: int = 0, n_layer: int | None = None,
                 vocab_size: int | None = None, n_embd: int | None = None, n_ff_exp: int | None = None,
                 progress: Callable[[str], None] | None = None) -> Written:
    """Write a preset model to `path` tensor by tensor (a `.partial` file renamed at the end)."""
    import gguf

    d = resolve_dims(preset_name, quant, n_layer=n_layer, vocab_size=vocab_size)
    if n_embd is not None or n_ff_exp is not None:  # small variants for tests
        d = replace(d, n_embd=n_embd or d.n_embd, n_ff_exp=n_ff_exp or d.n_ff_exp)
        n_head = d.n_embd // 128 if d.n_embd % 128 == 0 else 4
        d = replace(d, n_head=n_head, n_head_kv=min(d.n_head_kv, n_head))
    block = 256 if quant == "Q4_K" else 32
    if d.n_embd % block or d.n_ff_exp % block:
        raise BmoeError(f"n_embd and n_ff_exp must be multiples of {block} for {quant}")
    plan = plan_routing(d, routing_skew, routing_repeat, seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    designed: dict[int, Any] = {}
    specs = list(_specs(d, quant, plan, seed, designed))
    writer = gguf.GGUFWriter(tmp, "qwen3moe")
    try:
        for kv in _kvs(d, quant, preset_name, plan):
            writer.add_key_value(kv.name, kv.value, kv.vtype, sub_type=kv.sub_type)
        for s in specs:
            if s.qtype == "F32":
                writer.add_tensor_info(s.name, s.shape, _np_float32(), s.nbytes)
            else:
                writer.add_tensor_info(s.name, s.byte_shape, _np_uint8(), s.nbytes,
                                       raw_dtype=gguf.GGMLQuantizationType[s.qtype])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, s in enumerate(specs):
            array = s.make()
            if array.nbytes != s.nbytes:
                raise AssertionError(f"{s.name}: {array.nbytes} bytes, expected {s.nbytes}")
            writer.write_tensor_data(array)
            del array
            if progress and (s.name.endswith("ffn_down_exps.weight") or i == len(specs) - 1):
                progress(f"{s.name} ({i + 1}/{len(specs)})")
    finally:
        writer.close()
    tmp.replace(path)
    return Written(path, path.stat().st_size, preset_name, quant, plan, d)


def _np_float32() -> Any:
    import numpy as np

    return np.dtype(np.float32)


def _np_uint8() -> Any:
    import numpy as np

    return np.dtype(np.uint8)


def describe(w: Written) -> str:
    d, p = w.dims, w.plan
    routing = ("random router (uniform routing)" if not p.shaped else
               f"shaped router: Zipf skew {p.skew:g}, previous-token reuse {p.repeat:.2f} "
               f"(simulated {p.sim_repeat:.2f}, fitted Zipf {p.sim_zipf:.2f}, rho {p.rho:.3f})")
    return (f"{w.path}: {w.bytes / 1e9:.2f} GB, {w.quant}, {d.n_layer} layers, d={d.n_embd}, "
            f"{d.n_expert} experts top-{d.n_expert_used}, expert FF {d.n_ff_exp}, "
            f"slice {expert_slice_bytes(d, w.quant):,} B, vocab {d.n_vocab}; {routing}")
