"""Fixture rows of MiniMax's models at the pin beside minimax-m2 (MiniMax-M3, MiniMax-01): one data row
each, from `src/models/minimax-m3.cpp` and `minimax-01.cpp`. They join the single table in `arch_rows`.
"""

from __future__ import annotations

from dataclasses import replace

from bmoe_edge.synthetic.arch_parts import (
    ATTN_NORM,
    ATTN_OUT,
    DENSE_LEAD_FFN,
    EXP_PROBS_B,
    EXPERT_SUFFIXES,
    EXPERTS,
    FFN_NORM,
    HEAD_KEYS,
    MOE_KEYS,
    MOE_ONLY,
    QK_HEAD_NORM,
    QKV,
    ROUTER,
    SHEXP,
    SIGMOID,
    ArchRow,
    _t,
    qk_indexer,
)
from bmoe_edge.synthetic.gguf_kv import Key

MINIMAX_M3 = ArchRow(
    # MiniMax-M3 (minimax-m3.cpp): GQA with per-head q/k norms, a dense first layer, then MoE layers
    # with swiglu-oai experts, sigmoid + bias routing, a shared expert, and MSA block-sparse attention:
    # an indexer (one head per kv group) picks the top blocks (4-token blocks here, top 2, 1 local).
    # llama.cpp runs MSA only with flash attention on, as the gates' flash-attn-on case does; their other
    # cases run the dense fallback (the indexer weights load, unused). MSA ropes the indexer's keys with the
    # attention's rotary dims, so they are the indexer's key length here (the model: 64 rotary dims of 128): with
    # the default, the whole head, a K-quant fixture's wider heads aborted llama.cpp (GGML_ASSERT(n_dims <= ne0)
    # in rope), stock llama-bench alike.
    name="minimax-m3",
    arch="minimax-m3",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
          *HEAD_KEYS, Key("leading_dense_block_count", "dense_lead"), Key("expert_shared_count", 1),
          Key("expert_weights_scale", 1.0, "f32"), Key("expert_weights_norm", True, "bool"),
          Key("expert_gating_func", SIGMOID),
          Key("attention.indexer.head_count", "head_kv"), Key("attention.indexer.key_length", "idx_dim"),
          Key("attention.indexer.top_k", 2), Key("attention.indexer.block_size", 4),
          Key("attention.indexer.local_blocks", 1), Key("rope.dimension_count", "idx_dim")),
    layer=(*QKV, *ATTN_OUT, *ATTN_NORM, *QK_HEAD_NORM, *FFN_NORM, *DENSE_LEAD_FFN, *MOE_ONLY, *EXP_PROBS_B,
           *SHEXP,
           *(replace(t, where="moe") for t in qk_indexer("kv_heads*idx_dim"))),
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64, "n_ff_shexp": 64, "n_dense_lead": 1, "idx_dim": 16},
)

MINIMAX_01 = ArchRow(
    # MiniMax-Text-01 (minimax-01.cpp): lightning attention (linear, recurrent: fused attn_qkv, an output
    # gate and a norm) between softmax-attention layers (full_attention_interval 2 here, 8 in the
    # model), a residual scale, experts sized by feed_forward_length, softmax routing, no shared expert.
    name="minimax-01",
    arch="minimax-01",
    keys=(*MOE_KEYS, Key("feed_forward_length", "ff_exp"), *HEAD_KEYS, Key("residual_scale", 1.0, "f32"),
          Key("full_attention_interval", 2)),
    layer=(*ATTN_NORM, *(replace(t, mixer="attn") for t in QKV),
           _t("attn_norm_2.weight", "q", init="norm", mixer="recr"),
           _t("attn_qkv.weight", "embd", "3*q", mixer="recr"), _t("attn_gate.weight", "embd", "q", mixer="recr"),
           *ATTN_OUT, *FFN_NORM, *ROUTER, *EXPERTS),
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64, "attn_every": 2},
)

ROWS: tuple[ArchRow, ...] = (MINIMAX_M3, MINIMAX_01)
