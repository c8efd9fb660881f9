"""Fixture rows of the architectures the engine refuses, kept to measure the refusal again: not in the
gate table (`arch_rows.ROWS`), each one's reason in `native/src/core/recipes.cpp`. `tiny-model --arch` writes
them like any row.
"""

from __future__ import annotations

from dataclasses import replace

from bmoe_edge.synthetic.arch_parts import (
    ATTN_NORM,
    EXPERT_SUFFIXES,
    EXPERTS,
    FFN_NORM,
    HEAD_KEYS,
    MOE_KEYS,
    QK_HEAD_NORM,
    QKV,
    ROUTER,
    ArchRow,
    Dims,
    _t,
)
from bmoe_edge.synthetic.arch_rows_deepseek import DEEPSEEK4
from bmoe_edge.synthetic.gguf_kv import Key

_DIFFUSION_LAYER = (*ATTN_NORM, *QKV, _t("attn_output.weight", "q", "embd"), *QK_HEAD_NORM, *FFN_NORM, *ROUTER,
                    *EXPERTS)

LLADA_MOE = ArchRow(
    # LLaDA-MoE-7B-A1B (llada-moe.cpp): a masked-diffusion decoder (non-causal attention), OLMoE-like layers.
    name="llada-moe",
    arch="llada-moe",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"), *HEAD_KEYS),
    layer=_DIFFUSION_LAYER,
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64},
)

RND1 = ArchRow(
    # RND1-Base-30B-A3B (rnd1.cpp): a diffusion decoder converted from Qwen3-30B-A3B (non-causal attention).
    name="rnd1",
    arch="rnd1",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"), *HEAD_KEYS),
    layer=_DIFFUSION_LAYER,
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64},
)

# Dense-only loaders in front of a graph that can route: a file with experts does not load.
PHI3 = ArchRow(
    # phi3 (phi3.cpp, the graph phimoe borrows): phimoe's experts under the dense name. llama.cpp's vocabulary
    # gives Phi-3's token attributes to any file whose general.name says "phi3" and then needs <|endoftext|>,
    # which the fixtures' SPM vocabulary lacks ("unordered_map::at"): the file is named otherwise.
    name="phi3",
    arch="phi3",
    file_name="phi-three",
    keys=(*MOE_KEYS, Key("feed_forward_length", "ff_exp"), Key("rope.dimension_count", "head_dim")),
    layer=(*ATTN_NORM, *QKV, _t("attn_output.weight", "q", "embd"), *FFN_NORM, *ROUTER, *EXPERTS),
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64},
)

LFM2 = ArchRow(
    # lfm2 (lfm2.cpp, the graph lfm2moe borrows): lfm2moe's layers under the dense name.
    name="lfm2",
    arch="lfm2",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
          Key("attention.head_count_kv", Dims.head_kv_per_layer, "u32_arr"), Key("shortconv.l_cache", "l_cache"),
          Key("expert_gating_func", 2)),
    layer=(*FFN_NORM, *ROUTER, *EXPERTS, _t("exp_probs_b.bias", "expert", init="bias"), *ATTN_NORM,
           *(replace(t, mixer="attn") for t in (*QK_HEAD_NORM, *QKV, _t("attn_output.weight", "q", "embd"))),
           _t("shortconv.conv.weight", "l_cache", "embd", mixer="recr"),
           _t("shortconv.in_proj.weight", "embd", "3*embd", mixer="recr"),
           _t("shortconv.out_proj.weight", "embd", "embd", mixer="recr")),
    experts=EXPERT_SUFFIXES,
    output_norm="token_embd_norm.weight",
    dims={"n_ff_exp": 64, "attn_every": 2},
)

# DFlash's DSpark draft on a DeepSeek-V4 backbone (dflash.cpp): V4's layers (hyper-connections, sinks,
# grouped output, sqrt-softplus routing, shared expert) with uncompressed sliding-window attention on
# every stage, and the encoder (fc over the target's hidden states at target_layers, enc.output_norm);
# no token_embd/output of its own: a draft shares its target's.
DFLASH = ArchRow(
    name="dflash",
    arch="dflash",
    keys=(*(k for k in DEEPSEEK4.keys if k.name.split(".")[-1] not in (
              "compress_ratios", "hash_layer_count", "nextn_predict_layers", "embedding_length_out")
            and not k.name.startswith("attention.indexer")),
          Key("target_layers", lambda d: [1, 2], "u32_arr")),
    layer=tuple(t for t in DEEPSEEK4.layer if t.mixer == "all" and t.where in ("all", "scored", "moe")),
    experts=EXPERT_SUFFIXES,
    model=(*DEEPSEEK4.model, _t("fc.weight", "2*embd", "embd"), _t("enc.output_norm.weight", "embd", init="norm")),
    dims={**DEEPSEEK4.dims, "kinds": "A", "n_hash": 0, "n_nextn": 0},
    embeddings=False,
)

ROWS: dict[str, ArchRow] = {row.name: row for row in (LLADA_MOE, RND1, PHI3, LFM2, DFLASH)}
