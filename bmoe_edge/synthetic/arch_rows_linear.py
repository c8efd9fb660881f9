"""Fixture rows of linear-attention hybrids with hyper-connections at the pin (Qwen4-Exp): one data row,
from `src/models/qwen4exp.cpp`. It joins the single table in `arch_rows`.
"""

from __future__ import annotations

from dataclasses import replace

from bmoe_edge.synthetic.arch_parts import (
    DELTA_NET,
    EXPERT_SUFFIXES,
    HEAD_KEYS,
    MOE_KEYS,
    QK_HEAD_NORM,
    QKV,
    QWEN_NEXT_FFN,
    SSM_KEYS,
    ArchRow,
    _t,
    qk_indexer,
)
from bmoe_edge.synthetic.gguf_kv import Key


def _hc(prefix: str) -> tuple:
    """A low-rank hyper-connection module (norm gammas per copy, down/up, inject), kept in F32."""
    return (_t(f"{prefix}_norm.weight", "embd", "hc_mult", init="norm", f32=True),
            _t(f"{prefix}_down.weight", "hc_dim", "hc_lr", f32=True),
            _t(f"{prefix}_up.weight", "hc_lr", "hc_dim", f32=True),
            _t(f"{prefix}_inject.weight", "hc_dim", "hc_mult", f32=True))


QWEN4EXP = ArchRow(
    # Qwen4-Exp (qwen4exp.cpp): Qwen3.5's gated delta net (separate ssm_beta / ssm_alpha) with gated
    # attention (q and its gate in one projection) every 2nd layer here (4th in the model), the latter
    # with an indexer over compressed blocks (compress ratio 4, top-4); low-rank hyper-connections
    # (4 residual copies; two modules per layer and one before the head, which carry the norms: no
    # attn_norm, ffn_norm or output_norm); M-RoPE sections; every layer's FFN routed plus a gated shared
    # expert. No PLE n-gram embeddings (their keys absent, as in files without them).
    name="qwen4exp",
    arch="qwen4exp",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
          Key("expert_shared_feed_forward_length", "ff_shexp"), *HEAD_KEYS, *SSM_KEYS,
          Key("full_attention_interval", 2),
          # The indexer ropes its idx_dim-wide keys with the model's n_rot: the rope is partial where the
          # heads are wider than the indexer's (K-quant fixtures; the real model too), as wide where not.
          Key("rope.dimension_count", "idx_dim"),
          Key("rope.dimension_sections", lambda d: [d.idx_dim // 4, d.idx_dim // 8, d.idx_dim // 8, 0],
              "u32_arr"),
          Key("hyper_connection.count", "hc_mult"), Key("hyper_connection.low_rank", "hc_lr"),
          Key("attention.indexer.head_count", "idx_heads"), Key("attention.indexer.key_length", "idx_dim"),
          Key("attention.indexer.top_k", 4),
          Key("attention.compress_ratios", lambda d: [4 if d.kind(il) == "A" else 0 for il in range(d.n_layer)],
              "u32_arr")),
    layer=(*_hc("hc_attn"), *_hc("hc_ffn"),
           *(replace(t, mixer="attn") for t in (
               _t("attn_q.weight", "embd", "2q"), *QKV[1:], _t("attn_output.weight", "q", "embd"), *QK_HEAD_NORM,
               *qk_indexer("idx_heads*idx_dim"))),
           *DELTA_NET,
           _t("ssm_beta.weight", "embd", "ssm_heads", mixer="recr"),
           _t("ssm_alpha.weight", "embd", "ssm_heads", mixer="recr"), *QWEN_NEXT_FFN),
    experts=EXPERT_SUFFIXES,
    model=(_t("output_hc_norm.weight", "embd", "hc_mult", init="norm", f32=True),
           _t("output_hc_down.weight", "hc_dim", "hc_lr", f32=True),
           _t("output_hc_up.weight", "hc_lr", "hc_dim", f32=True)),
    output_norm="",
    dims={"n_ff_exp": 64, "n_ff_shexp": 64, "attn_every": 2},
)

ROWS: tuple[ArchRow, ...] = (QWEN4EXP,)
