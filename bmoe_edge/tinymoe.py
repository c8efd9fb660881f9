"""Tiny synthetic MoE ggufs for tests and gates: random weights from a seed, a real small tokenizer.

One data row per architecture (`ROWS`): the gguf architecture name, the metadata keys its
`load_arch_hparams` reads, the per-layer tensors (names and shapes in llama.cpp's `ne` order, as in
`src/models/<arch>.cpp`) and which tensors are the routed experts. The writer is generic: it
resolves the shapes, draws the weights and writes them with the `gguf` package (F32, F16, Q8_0,
Q4_0 via `gguf.quants`); K-quants are made by llama.cpp's own quantizer (`bmoe_edge._native`) from
an F32 fixture of the same model with 256-aligned rows.

The weights are random but shaped so greedy decoding has clear top-1 margins: the embedding
dominates the residual stream (RMS ~4 against ~1 per sub-layer) and the output matrix maps each
normal token to a fixed random successor (`output[succ[t]] = embedding[t]`), so the model is a
noisy bigram chain whose logits still depend on every layer (attention and routed experts).
The vocabulary is llama.cpp's own `models/ggml-vocab-llama-spm.gguf` (SPM, 32000 tokens): its
`tokenizer.*` keys are copied with their types (`vocab_size=N` keeps the first N tokens, for fast
structural tests).

Expert slices (bytes of one expert of one projection) differ per row so the page logic sees both
cases: e.g. qwen3moe Q4_0 4608 B (slices straddle 4 KiB pages), olmoe Q4_0 1152 B (three or four
slices share a page), F32 up to 40 KiB. `fixture()` caches files under $BMOE_EDGE_CACHE/fixtures.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import tempfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bmoe_edge import llama_source
from bmoe_edge.errors import BmoeError

VOCAB_NAME = "llama-spm"
N_EXPERT = 8
N_EXPERT_USED = 2
N_HEAD = 4

EMBD_RMS = 4.0  # RMS of the input embedding (after any arch input multiplier)
LOGIT_SCALE = 2.0  # output rows are embedding rows scaled by LOGIT_SCALE / sqrt(n_embd)
BIAS_STD = 0.1

# Types written by the `gguf` package directly, and types made by llama.cpp's quantizer (ftype names).
DIRECT_QUANTS = ("F32", "F16", "Q8_0", "Q4_0")
LLAMA_QUANTS = ("Q4_K_M",)
QUANTS: tuple[str, ...] = DIRECT_QUANTS + LLAMA_QUANTS

_FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7}  # llama_ftype values


# ---------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Tensor:
    """One tensor of a layer (`blk.{i}.` is prefixed) or of the model.

    `ne` is in llama.cpp's order (`ne[0]` is the row length), each entry a dimension name of `Dims`.
    `init`: "weight" (random, 1/sqrt(ne[0])), "norm" (ones), "bias" (small random), "sinks",
    "router_scale" (gemma4's per-channel router input scale).
    `where`: "all" layers, only the leading "dense" layers (`Dims.n_dense_lead`), or only "moe" layers.
    """

    name: str
    ne: tuple[str, ...]
    init: str = "weight"
    where: str = "all"

    def in_layer(self, il: int, d: Dims) -> bool:
        if self.where == "dense":
            return il < d.n_dense_lead
        if self.where == "moe":
            return il >= d.n_dense_lead
        return True


@dataclass(frozen=True)
class Key:
    """A metadata key under `<arch>.`: a literal, a dimension name of `Dims`, or a function of `Dims`."""

    name: str
    value: Any
    kind: str = "u32"  # u32 | f32 | bool_arr


@dataclass(frozen=True)
class ArchRow:
    name: str  # the user-facing name in ARCHS
    arch: str  # general.architecture
    keys: tuple[Key, ...]
    layer: tuple[Tensor, ...]
    experts: tuple[str, ...]  # routed expert tensors (suffixes of blk.N.<suffix>.weight); () = dense
    model: tuple[Tensor, ...] = ()  # global tensors besides token_embd/output_norm/output
    dims: dict[str, int] = field(default_factory=dict)  # overrides of Dims defaults
    input_multiplier: Callable[[Dims], float] | None = None  # the graph's scale of the embedding

    @property
    def is_moe(self) -> bool:
        return bool(self.experts)


@dataclass(frozen=True)
class Dims:
    n_layer: int = 4
    n_embd: int = 64
    n_ff: int = 128  # dense FFN (dense rows, gemma4's shared MLP)
    n_ff_exp: int = 128  # one expert's FFN width
    n_ff_shexp: int = 128  # qwen2moe's shared expert
    n_head: int = N_HEAD
    n_head_kv: int = 2
    n_vocab: int = 32000  # set from the vocabulary when writing
    n_swa: int = 32
    n_dense_lead: int = 0  # leading layers with a dense FFN instead of experts (deepseek2)
    # MLA (deepseek2)
    q_lora: int = 32
    kv_lora: int = 64
    qk_rope: int = 16
    qk_nope: int = 32
    v_mla: int = 16

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def value(self, sym: str) -> int:
        table = {
            "embd": self.n_embd,
            "ff": self.n_ff,
            "ff_exp": self.n_ff_exp,
            "2*ff_exp": 2 * self.n_ff_exp,
            "ff_shexp": self.n_ff_shexp,
            "expert": N_EXPERT,
            "expert_used": N_EXPERT_USED,
            "head": self.n_head,
            "head_kv": self.n_head_kv,
            "head_dim": self.head_dim,
            "head_dim/2": self.head_dim // 2,
            "q": self.n_head * self.head_dim,
            "kv": self.n_head_kv * self.head_dim,
            "layer": self.n_layer,
            "vocab": self.n_vocab,
            "swa": self.n_swa,
            "dense_lead": self.n_dense_lead,
            "q_lora": self.q_lora,
            "kv_lora": self.kv_lora,
            "qk_rope": self.qk_rope,
            "qk_nope": self.qk_nope,
            "v_mla": self.v_mla,
            "k_mla": self.qk_nope + self.qk_rope,
            "kv_lora+rope": self.kv_lora + self.qk_rope,
            "head*k_mla": self.n_head * (self.qk_nope + self.qk_rope),
            "head*v_mla": self.n_head * self.v_mla,
        }
        return table[sym]


def _t(name: str, *ne: str, init: str = "weight", where: str = "all") -> Tensor:
    return Tensor(name, tuple(ne), init, where)


ATTN_NORM = (_t("attn_norm.weight", "embd", init="norm"),)
QKV = (
    _t("attn_q.weight", "embd", "q"),
    _t("attn_k.weight", "embd", "kv"),
    _t("attn_v.weight", "embd", "kv"),
)
QKV_BIAS = (
    _t("attn_q.bias", "q", init="bias"),
    _t("attn_k.bias", "kv", init="bias"),
    _t("attn_v.bias", "kv", init="bias"),
)
ATTN_OUT = (_t("attn_output.weight", "q", "embd"),)
QK_HEAD_NORM = (
    _t("attn_q_norm.weight", "head_dim", init="norm"),
    _t("attn_k_norm.weight", "head_dim", init="norm"),
)
FFN_NORM = (_t("ffn_norm.weight", "embd", init="norm"),)
ROUTER = (_t("ffn_gate_inp.weight", "embd", "expert"),)
EXPERTS = (
    _t("ffn_gate_exps.weight", "embd", "ff_exp", "expert"),
    _t("ffn_up_exps.weight", "embd", "ff_exp", "expert"),
    _t("ffn_down_exps.weight", "ff_exp", "embd", "expert"),
)
EXPERT_SUFFIXES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
DENSE_FFN = (
    _t("ffn_gate.weight", "embd", "ff"),
    _t("ffn_up.weight", "embd", "ff"),
    _t("ffn_down.weight", "ff", "embd"),
)

MOE_KEYS = (Key("expert_count", "expert"), Key("expert_used_count", "expert_used"))
HEAD_KEYS = (Key("attention.key_length", "head_dim"), Key("attention.value_length", "head_dim"))


def _swa_every_4th_full(d: Dims) -> list[bool]:
    return [(i % 4) != 3 for i in range(d.n_layer)]


_ROWS: tuple[ArchRow, ...] = (
    ArchRow(
        name="qwen3moe",
        arch="qwen3moe",
        keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
              *HEAD_KEYS),
        layer=(*ATTN_NORM, *QKV, *ATTN_OUT, *QK_HEAD_NORM, *FFN_NORM, *ROUTER, *EXPERTS),
        experts=EXPERT_SUFFIXES,
    ),
    ArchRow(
        name="qwen2moe",
        arch="qwen2moe",
        keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
              Key("expert_shared_feed_forward_length", "ff_shexp")),
        layer=(*ATTN_NORM, *QKV, *QKV_BIAS, *ATTN_OUT, *FFN_NORM, *ROUTER, *EXPERTS,
               _t("ffn_gate_inp_shexp.weight", "embd"),
               _t("ffn_gate_shexp.weight", "embd", "ff_shexp"),
               _t("ffn_up_shexp.weight", "embd", "ff_shexp"),
               _t("ffn_down_shexp.weight", "ff_shexp", "embd")),
        experts=EXPERT_SUFFIXES,
        dims={"n_ff_exp": 96},
    ),
    ArchRow(
        # olmoe: q/k norms span the whole projection (so n_head_kv == n_head); experts use n_ff.
        name="olmoe",
        arch="olmoe",
        keys=(*MOE_KEYS, Key("feed_forward_length", "ff_exp")),
        layer=(*ATTN_NORM, *QKV, *ATTN_OUT,
               _t("attn_q_norm.weight", "embd", init="norm"), _t("attn_k_norm.weight", "embd", init="norm"),
               *FFN_NORM, *ROUTER, *EXPERTS),
        experts=EXPERT_SUFFIXES,
        dims={"n_ff_exp": 32, "n_head_kv": N_HEAD},  # small experts: several slices per 4 KiB page
    ),
    ArchRow(
        # Mixtral-style: llama with llama.expert_count; experts use n_ff.
        name="llama",
        arch="llama",
        keys=(*MOE_KEYS, Key("feed_forward_length", "ff_exp"), Key("rope.dimension_count", "head_dim")),
        layer=(*ATTN_NORM, *QKV, *ATTN_OUT, *FFN_NORM, *ROUTER, *EXPERTS),
        experts=EXPERT_SUFFIXES,
        dims={"n_ff_exp": 160},
    ),
    ArchRow(
        # gpt-oss: attention sinks, biases everywhere (router and experts too), swiglu-oai,
        # alternating sliding-window layers; post_attention_norm is the pre-FFN norm.
        name="gpt-oss",
        arch="gpt-oss",
        keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff_exp"),
              *HEAD_KEYS, Key("attention.sliding_window", "swa")),
        layer=(*ATTN_NORM, _t("post_attention_norm.weight", "embd", init="norm"),
               *QKV, *QKV_BIAS, *ATTN_OUT, _t("attn_output.bias", "embd", init="bias"),
               _t("attn_sinks.weight", "head", init="sinks"),
               *ROUTER, _t("ffn_gate_inp.bias", "expert", init="bias"),
               *EXPERTS,
               _t("ffn_gate_exps.bias", "ff_exp", "expert", init="bias"),
               _t("ffn_up_exps.bias", "ff_exp", "expert", init="bias"),
               _t("ffn_down_exps.bias", "embd", "expert", init="bias")),
        experts=EXPERT_SUFFIXES,
        dims={"n_ff_exp": 64},
    ),
    ArchRow(
        # gemma4 (26B-A4B layout): fused ffn_gate_up_exps, a dense shared MLP beside the experts,
        # router on rms_norm(x) * ffn_gate_inp.scale, SWA pattern, rope_freqs for full layers.
        name="gemma4",
        arch="gemma4",
        keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
              *HEAD_KEYS, Key("attention.key_length_swa", "head_dim"),
              Key("attention.value_length_swa", "head_dim"),
              Key("attention.sliding_window", "swa"),
              Key("attention.sliding_window_pattern", _swa_every_4th_full, "bool_arr"),
              Key("attention.shared_kv_layers", 0),
              Key("embedding_length_per_layer_input", 0),
              Key("rope.freq_base_swa", 10000.0, "f32")),
        layer=(*ATTN_NORM, *QKV, *ATTN_OUT, *QK_HEAD_NORM,
               _t("post_attention_norm.weight", "embd", init="norm"),
               *FFN_NORM, *DENSE_FFN, _t("post_ffw_norm.weight", "embd", init="norm"),
               *ROUTER, _t("ffn_gate_inp.scale", "embd", init="router_scale"),
               _t("pre_ffw_norm_2.weight", "embd", init="norm"),
               _t("post_ffw_norm_1.weight", "embd", init="norm"),
               _t("post_ffw_norm_2.weight", "embd", init="norm"),
               _t("ffn_gate_up_exps.weight", "embd", "2*ff_exp", "expert"),
               _t("ffn_down_exps.weight", "ff_exp", "embd", "expert")),
        experts=("ffn_gate_up_exps", "ffn_down_exps"),
        model=(_t("rope_freqs.weight", "head_dim/2", init="norm"),),
        dims={"n_ff_exp": 64},
        input_multiplier=lambda d: math.sqrt(d.n_embd),
    ),
    ArchRow(
        # granitemoe: llama-like experts plus Granite's scalars (logit_scale is required).
        name="granitemoe",
        arch="granitemoe",
        keys=(*MOE_KEYS, Key("feed_forward_length", "ff_exp"), Key("logit_scale", 0.5, "f32"),
              Key("embedding_scale", 12.0, "f32"), Key("residual_scale", 0.5, "f32"),
              Key("attention.scale", lambda d: 1.0 / d.head_dim, "f32")),
        layer=(*ATTN_NORM, *QKV, *ATTN_OUT, *FFN_NORM, *ROUTER, *EXPERTS),
        experts=EXPERT_SUFFIXES,
        dims={"n_ff_exp": 64},
        input_multiplier=lambda d: 12.0,
    ),
    ArchRow(
        # deepseek2 (V2/V3 layout, MLA with split attn_k_b/attn_v_b): the first layer is dense
        # (leading_dense_block_count), the others have experts plus one shared expert.
        name="deepseek2",
        arch="deepseek2",
        keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
              Key("leading_dense_block_count", "dense_lead"), Key("expert_shared_count", 1),
              Key("expert_weights_scale", 1.0, "f32"), Key("expert_gating_func", 1),  # 1 = softmax
              Key("attention.q_lora_rank", "q_lora"), Key("attention.kv_lora_rank", "kv_lora"),
              Key("attention.key_length", "kv_lora+rope"), Key("attention.value_length", "kv_lora"),
              Key("attention.key_length_mla", "k_mla"), Key("attention.value_length_mla", "v_mla"),
              Key("rope.dimension_count", "qk_rope")),
        layer=(*ATTN_NORM,
               _t("attn_q_a.weight", "embd", "q_lora"),
               _t("attn_q_a_norm.weight", "q_lora", init="norm"),
               _t("attn_q_b.weight", "q_lora", "head*k_mla"),
               _t("attn_kv_a_mqa.weight", "embd", "kv_lora+rope"),
               _t("attn_kv_a_norm.weight", "kv_lora", init="norm"),
               _t("attn_k_b.weight", "qk_nope", "kv_lora", "head"),
               _t("attn_v_b.weight", "kv_lora", "v_mla", "head"),
               _t("attn_output.weight", "head*v_mla", "embd"),
               *FFN_NORM,
               *(replace(t, where="dense") for t in DENSE_FFN),
               *(replace(t, where="moe") for t in (*ROUTER, *EXPERTS)),
               _t("ffn_gate_shexp.weight", "embd", "ff_exp", where="moe"),
               _t("ffn_up_shexp.weight", "embd", "ff_exp", where="moe"),
               _t("ffn_down_shexp.weight", "ff_exp", "embd", where="moe")),
        experts=EXPERT_SUFFIXES,
        dims={"n_ff_exp": 64, "n_dense_lead": 1, "n_head_kv": 1},  # MLA caches one latent "head"
    ),
    ArchRow(
        # A dense llama (no experts): for negative tests (streaming must refuse it).
        name="dense",
        arch="llama",
        keys=(Key("feed_forward_length", "ff"), Key("rope.dimension_count", "head_dim")),
        layer=(*ATTN_NORM, *QKV, *ATTN_OUT, *FFN_NORM, *DENSE_FFN),
        experts=(),
    ),
)

ROWS: dict[str, ArchRow] = {row.name: row for row in _ROWS}
ARCHS: tuple[str, ...] = tuple(ROWS)
MOE_ARCHS: tuple[str, ...] = tuple(name for name, row in ROWS.items() if row.is_moe)

# Dimensions for K-quants: the expert, FFN and embedding row lengths become multiples of 256 (QK_K)
# so llama.cpp's quantizer really makes K-quant experts (only deepseek2's small MLA projections
# fall back to a 32-block type, as they would in a real model with odd sizes).
_KQUANT_DIMS = {"n_embd": 256, "n_ff": 256, "n_ff_exp": 256, "n_ff_shexp": 256}


# ---------------------------------------------------------------------------------------------
# Validation and dimensions


def expert_tensors(arch: str, *, n_layer: int = 4) -> list[str]:
    """The routed expert tensor names of a fixture, layer by layer (empty for the dense row)."""
    row = _row(arch)
    d = replace(Dims(), n_layer=n_layer, **row.dims)
    by_suffix = {t.name.removesuffix(".weight"): t for t in row.layer}
    return [f"blk.{il}.{suffix}.weight" for il in range(n_layer) for suffix in row.experts
            if by_suffix[suffix].in_layer(il, d)]


def _row(arch: str) -> ArchRow:
    try:
        return ROWS[arch]
    except KeyError:
        raise BmoeError(f"unknown tiny-model architecture {arch!r} (known: {', '.join(ARCHS)})") from None


def _check_quant(quant: str) -> str:
    if quant not in QUANTS:
        raise BmoeError(f"unknown tiny-model quant type {quant!r} (known: {', '.join(QUANTS)})")
    return quant


def block_size(quant: str) -> int:
    """The row-length multiple a quant type needs (256 for K-quants)."""
    return 256 if quant in LLAMA_QUANTS else (32 if quant in ("Q8_0", "Q4_0") else 1)


def dims_for(arch: str, quant: str, *, n_layer: int = 4, n_embd: int | None = None,
             n_ff_exp: int | None = None) -> Dims:
    """The resolved dimensions of a fixture (row defaults, K-quant alignment, explicit overrides)."""
    row = _row(arch)
    _check_quant(quant)
    d = replace(Dims(), n_layer=n_layer, **row.dims)
    if quant in LLAMA_QUANTS:
        d = replace(d, **_KQUANT_DIMS)
    if n_embd is not None:
        d = replace(d, n_embd=n_embd)
    if n_ff_exp is not None:
        d = replace(d, n_ff_exp=n_ff_exp)
    if n_layer < 1:
        raise BmoeError(f"n_layer must be at least 1, got {n_layer}")
    if d.n_embd % d.n_head or d.head_dim % 2:
        raise BmoeError(f"n_embd {d.n_embd} must be a multiple of {2 * d.n_head}")
    align = max(block_size(quant), 32)
    for name in ("n_embd", "n_ff", "n_ff_exp", "n_ff_shexp"):
        if getattr(d, name) % align:
            raise BmoeError(f"{name} = {getattr(d, name)} is not a multiple of {align} (needed by {quant})")
    return d


# ---------------------------------------------------------------------------------------------
# The vocabulary


def vocab_path() -> Path:
    for patched in (True, False):
        path = llama_source.default_dest(patched) / "models" / f"ggml-vocab-{VOCAB_NAME}.gguf"
        if path.is_file():
            return path
    raise BmoeError(
        f"the vocabulary ggml-vocab-{VOCAB_NAME}.gguf of the pinned llama.cpp is missing: "
        "run `bmoe-edge llama fetch` first"
    )


@dataclass(frozen=True)
class _KV:
    name: str
    value: Any
    vtype: Any  # gguf.GGUFValueType
    sub_type: Any = None


def _reader_kvs(reader: Any, prefix: str = "") -> list[_KV]:
    """Key/values of a GGUFReader with their exact types (strings kept as raw bytes)."""
    import gguf

    out = []
    for name, fld in reader.fields.items():
        if name.startswith("GGUF.") or not name.startswith(prefix):
            continue
        main = fld.types[0]
        if main == gguf.GGUFValueType.ARRAY:
            sub = fld.types[-1]
            if len(fld.types) != 2:
                raise BmoeError(f"nested gguf array {name} is not supported")
            if sub == gguf.GGUFValueType.STRING:
                value: Any = [bytes(fld.parts[i]) for i in fld.data]
            else:
                value = [fld.parts[i].tolist()[0] for i in fld.data]
            out.append(_KV(name, value, main, sub))
        elif main == gguf.GGUFValueType.STRING:
            out.append(_KV(name, bytes(fld.parts[fld.data[0]]), main))
        else:
            out.append(_KV(name, fld.parts[fld.data[0]].tolist()[0], main))
    return out


@functools.lru_cache(maxsize=1)
def _vocab() -> tuple[tuple[_KV, ...], Any]:
    """The tokenizer.* key/values of the vocabulary gguf and its token types (numpy int32)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(vocab_path())
    kvs = tuple(_reader_kvs(reader, "tokenizer."))
    fld = reader.fields["tokenizer.ggml.token_type"]
    token_type = np.array([fld.parts[i][0] for i in fld.data], dtype=np.int32)
    return kvs, token_type


MIN_VOCAB = 300  # the SPM control tokens and the 256 byte tokens, and a few pieces


def _vocab_kvs(n_vocab: int) -> list[_KV]:
    """The tokenizer.* key/values, the per-token arrays cut to the first `n_vocab` tokens if fewer."""
    kvs, token_type = _vocab()
    n_full = len(token_type)
    if n_vocab == n_full:
        return list(kvs)
    return [replace(kv, value=kv.value[:n_vocab]) if kv.sub_type is not None and len(kv.value) == n_full
            else kv for kv in kvs]


def full_vocab_size() -> int:
    return len(_vocab()[1])


# ---------------------------------------------------------------------------------------------
# Weights


def _rng(seed: int, row: ArchRow, name: str) -> Any:
    import numpy as np

    # One stream per (row, tensor name): adding a tensor to a row leaves every other tensor unchanged,
    # and two rows with the same tensor names still get different models.
    return np.random.default_rng([seed, zlib.crc32(row.name.encode()), zlib.crc32(name.encode())])


def _init(init: str, row: ArchRow, name: str, ne: tuple[int, ...], seed: int, d: Dims) -> Any:
    import numpy as np

    shape = tuple(reversed(ne))  # numpy order: ne[0] is the last (contiguous) axis
    rng = _rng(seed, row, name)
    if init == "norm":
        return np.ones(shape, dtype=np.float32)
    if init == "router_scale":
        return np.full(shape, math.sqrt(d.n_embd), dtype=np.float32)
    if init == "bias":
        return (rng.standard_normal(shape, dtype=np.float32) * BIAS_STD).astype(np.float32)
    if init == "sinks":
        return (rng.standard_normal(shape, dtype=np.float32) * 0.5).astype(np.float32)
    if init == "weight":
        scale = np.float32(1.0 / math.sqrt(ne[0]))  # ~unit-variance outputs for unit-RMS inputs
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
    raise AssertionError(f"unknown init {init}")


def _embeddings(row: ArchRow, d: Dims, seed: int) -> tuple[Any, Any]:
    """token_embd and output: each normal token's output row is the embedding of its predecessor."""
    import numpy as np

    token_type = _vocab()[1][: d.n_vocab]
    base = _rng(seed, row, "token_embd.base").standard_normal((d.n_vocab, d.n_embd), dtype=np.float32)
    mult = row.input_multiplier(d) if row.input_multiplier else 1.0
    tok_embd = (base * np.float32(EMBD_RMS / mult)).astype(np.float32)

    rng = _rng(seed, row, "output.successor")
    normal = np.flatnonzero(token_type == 1)  # LLAMA_TOKEN_TYPE_NORMAL: never map onto control/byte tokens
    succ = rng.permutation(normal)
    out_scale = np.float32(LOGIT_SCALE / math.sqrt(d.n_embd))
    output = (rng.standard_normal((d.n_vocab, d.n_embd), dtype=np.float32) * out_scale * np.float32(0.25))
    output[succ] = base[normal] * out_scale
    return tok_embd, output.astype(np.float32)


def _quantizable(name: str, ndim: int) -> bool:
    """llama.cpp's rule (llama-quant.cpp tensor_allows_quantization): 2-D/3-D `.weight`, not norms/router."""
    return (ndim >= 2 and name.endswith(".weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name)


def _encode(name: str, data: Any, quant: str) -> tuple[Any, Any]:
    """(array to write, raw ggml type or None) for one tensor."""
    import gguf

    if not _quantizable(name, data.ndim) or quant == "F32":
        return data, None
    if quant == "F16":
        return data.astype("float16"), None
    qtype = gguf.GGMLQuantizationType[quant]
    return gguf.quants.quantize(data, qtype), qtype


def _model_tensors(row: ArchRow, d: Dims, seed: int) -> list[tuple[str, Any]]:
    tok_embd, output = _embeddings(row, d, seed)
    tensors: list[tuple[str, Any]] = [("token_embd.weight", tok_embd)]
    for t in row.model:
        ne = tuple(d.value(s) for s in t.ne)
        tensors.append((t.name, _init(t.init, row, t.name, ne, seed, d)))
    for il in range(d.n_layer):
        for t in row.layer:
            if not t.in_layer(il, d):
                continue
            name = f"blk.{il}.{t.name}"
            ne = tuple(d.value(s) for s in t.ne)
            tensors.append((name, _init(t.init, row, name, ne, seed, d)))
    tensors.append(("output_norm.weight", _init("norm", row, "output_norm.weight", (d.n_embd,), seed, d)))
    tensors.append(("output.weight", output))
    return tensors


# ---------------------------------------------------------------------------------------------
# Writing


def shard_paths(path: Path, split: int) -> list[Path]:
    """The files of a model written to `path` in `split` shards (llama.cpp's gguf-split names).

    `path` may also be the first shard itself (`<stem>-00001-of-0000N.gguf`, what `fixture` returns).
    """
    path = Path(path)
    if split <= 1:
        return [path]
    stem = path.name[:-5] if path.name.endswith(".gguf") else path.name
    first = re.fullmatch(r"(.+)-00001-of-(\d{5})", stem)
    if first and int(first.group(2)) == split:
        stem = first.group(1)
    return [path.with_name(f"{stem}-{i:05d}-of-{split:05d}.gguf") for i in range(1, split + 1)]


def _write_gguf(path: Path, arch: str, kvs: Sequence[_KV], tensors: Sequence[tuple[str, Any, Any]],
                split: int) -> list[Path]:
    """Write kvs and (name, array, raw_dtype) tensors, in `split` shards by tensor count."""
    import gguf

    if split < 1:
        raise BmoeError(f"--split must be at least 1, got {split}")
    if split > len(tensors):
        raise BmoeError(f"cannot split {len(tensors)} tensors into {split} shards")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, arch)
    for kv in kvs:
        writer.add_key_value(kv.name, kv.value, kv.vtype, sub_type=kv.sub_type)
    for name, array, raw_dtype in tensors:
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    if split > 1:
        # Shard by tensor count, in file order, the way gguf-split --split-max-tensors does; the
        # writer then names the files <stem>-0000i-of-0000N.gguf and adds split.no/count/tensors.count.
        items = list(writer.tensors[0].items())
        bounds = [round(i * len(items) / split) for i in range(split + 1)]
        writer.tensors = [dict(items[bounds[i]:bounds[i + 1]]) for i in range(split)]
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    paths = shard_paths(path, split)
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise AssertionError(f"gguf writer did not produce {missing}")
    return paths


def _direct(path: Path, row: ArchRow, quant: str, d: Dims, seed: int, split: int,
            label: str | None = None) -> list[Path]:
    import gguf

    prefix = row.arch
    kvs: list[_KV] = [
        _KV("general.name", f"bmoe-tiny-{row.name}-{label or quant}", gguf.GGUFValueType.STRING),
        _KV("general.file_type", _FILE_TYPE[quant], gguf.GGUFValueType.UINT32),
    ]
    if quant not in ("F32", "F16"):
        kvs.append(_KV("general.quantization_version", gguf.GGML_QUANT_VERSION, gguf.GGUFValueType.UINT32))
    base = (
        Key("context_length", 4096),
        Key("embedding_length", "embd"),
        Key("block_count", "layer"),
        Key("attention.head_count", "head"),
        Key("attention.head_count_kv", "head_kv"),
        Key("attention.layer_norm_rms_epsilon", 1e-6, "f32"),
        Key("rope.freq_base", 10000.0, "f32"),
    )
    for key in (*base, *row.keys):
        name = f"{prefix}.{key.name}"
        value = key.value(d) if callable(key.value) else key.value
        if key.kind == "u32":
            kvs.append(_KV(name, d.value(value) if isinstance(value, str) else int(value),
                           gguf.GGUFValueType.UINT32))
        elif key.kind == "f32":
            kvs.append(_KV(name, float(value), gguf.GGUFValueType.FLOAT32))
        elif key.kind == "bool_arr":
            kvs.append(_KV(name, [bool(v) for v in value], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL))
        else:
            raise AssertionError(key.kind)
    kvs.extend(_vocab_kvs(d.n_vocab))

    tensors = []
    for name, data in _model_tensors(row, d, seed):
        array, raw = _encode(name, data, quant)
        tensors.append((name, array, raw))
    return _write_gguf(path, row.arch, kvs, tensors, split)


def _resplit(src: Path, path: Path, split: int) -> list[Path]:
    """Rewrite a single-file gguf as `split` shards (keys and tensor bytes copied as they are)."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    kvs = [kv for kv in _reader_kvs(reader) if kv.name != "general.architecture"]
    tensors = [(t.name, t.data, t.tensor_type) for t in reader.tensors]
    paths = _write_gguf(path, arch, kvs, tensors, split)
    del reader
    return paths


def _requantized(path: Path, row: ArchRow, quant: str, d: Dims, seed: int, split: int) -> list[Path]:
    from bmoe_edge import native

    tmpdir = Path(tempfile.mkdtemp(prefix=".tinymoe-", dir=path.parent))
    try:
        src = tmpdir / "f32.gguf"
        _direct(src, row, "F32", d, seed, 1, label=quant)
        quantized = tmpdir / "q.gguf"
        with native.engine_errors():
            native.load().quantize_model(str(src), str(quantized), quant, 0)
        src.unlink()
        if split == 1:
            os.replace(quantized, path)
            return [path]
        return _resplit(quantized, path, split)
    finally:
        for p in tmpdir.iterdir():
            p.unlink()
        tmpdir.rmdir()


def write_tiny_moe(path: Path, arch: str, quant: str, *, seed: int = 0, split: int = 1, n_layer: int = 4,
                   n_embd: int | None = None, n_ff_exp: int | None = None,
                   vocab_size: int | None = None) -> list[Path]:
    """Write a tiny synthetic model of `arch` (one of ARCHS) in `quant` (one of QUANTS).

    With `split` > 1 the files are `<stem>-00001-of-0000N.gguf`... next to `path` (llama.cpp loads
    the first and finds the others). Returns the written paths, first shard first.
    `vocab_size` keeps only the first N tokens of the vocabulary (still a valid SPM vocabulary:
    control and byte tokens come first): much faster to write and parse, for structural tests.
    """
    path = Path(path)
    row = _row(arch)
    _check_quant(quant)
    if split < 1:
        raise BmoeError(f"split must be at least 1, got {split}")
    d = dims_for(arch, quant, n_layer=n_layer, n_embd=n_embd, n_ff_exp=n_ff_exp)
    n_full = full_vocab_size()
    if vocab_size is not None and not MIN_VOCAB <= vocab_size <= n_full:
        raise BmoeError(f"vocab_size must be between {MIN_VOCAB} and {n_full}, got {vocab_size}")
    d = replace(d, n_vocab=vocab_size or n_full)
    path.parent.mkdir(parents=True, exist_ok=True)
    if quant in LLAMA_QUANTS:
        return _requantized(path, row, quant, d, seed, split)
    return _direct(path, row, quant, d, seed, split)


# ---------------------------------------------------------------------------------------------
# The fixture cache


@functools.lru_cache(maxsize=1)
def generator_version() -> str:
    """Changes whenever this generator, the gguf package or the vocabulary change."""
    import gguf.gguf_writer

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(Path(gguf.gguf_writer.__file__).read_bytes())
    h.update(str(vocab_path().stat().st_size).encode())
    return h.hexdigest()[:12]


def fixtures_dir() -> Path:
    return llama_source.cache_dir() / "fixtures"


def fixture(arch: str, quant: str, *, seed: int = 0, split: int = 1) -> Path:
    """A cached fixture (generated on first use); for split models, the first shard."""
    _row(arch)
    _check_quant(quant)
    if split < 1:
        raise BmoeError(f"split must be at least 1, got {split}")
    version = generator_version()
    if quant in LLAMA_QUANTS:
        from bmoe_edge import native

        version += "-" + native.load().build_info().llama_pin.replace("=", "")
    cache = fixtures_dir()
    name = f"tiny-{arch}-{quant}-seed{seed}-split{split}-{version}.gguf"
    final = shard_paths(cache / name, split)
    if all(p.is_file() for p in final):
        return final[0]
    cache.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=".gen-", dir=cache))
    try:
        written = write_tiny_moe(tmpdir / name, arch, quant, seed=seed, split=split)
        # Last shard first, the first shard (what callers test and open) last.
        for src, dst in reversed(list(zip(written, final, strict=True))):
            os.replace(src, dst)
    finally:
        for p in tmpdir.iterdir():
            p.unlink()
        tmpdir.rmdir()
    return final[0]
