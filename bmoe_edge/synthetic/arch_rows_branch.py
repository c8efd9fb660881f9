"""Fixture rows of dense architectures whose graph has an optional MoE branch at the pin (taken when the
file has `<arch>.expert_count`): Mistral 3, Granite, Granite SWA, MiniCPM. One data row each, from the
architecture's `load_arch_hparams` / `load_arch_tensors`; they join the single table in `arch_rows`.
"""

from __future__ import annotations

from bmoe_edge.synthetic.arch_parts import (
    ATTN_NORM,
    ATTN_OUT,
    EXPERT_SUFFIXES,
    EXPERTS,
    FFN_NORM,
    MOE_KEYS,
    QKV,
    ROUTER,
    SHEXP,
    ArchRow,
    _t,
    swa_every_4th_full,
)
from bmoe_edge.synthetic.gguf_kv import Key

# The llama-style MoE branch these graphs share: experts sized by feed_forward_length.
_LLAMA_MOE = (*ATTN_NORM, *QKV, *ATTN_OUT, *FFN_NORM, *ROUTER, *EXPERTS)
_GRANITE_KEYS = (Key("logit_scale", 0.5, "f32"), Key("embedding_scale", 12.0, "f32"), Key("residual_scale", 0.5, "f32"),
                 Key("attention.scale", lambda d: 1.0 / d.head_dim, "f32"))


MISTRAL3 = ArchRow(
    # mistral3 (mistral3.cpp): the llama-style graph Ministral 3 / Mistral Small 3.x ship under; with
    # expert_count it takes its Mixtral-style MoE branch (no released model of that shape is known here),
    # an optional attention output bias (present here).
    name="mistral3",
    arch="mistral3",
    keys=(*MOE_KEYS, Key("feed_forward_length", "ff_exp"), Key("rope.dimension_count", "head_dim")),
    layer=(*_LLAMA_MOE, _t("attn_output.bias", "embd", init="bias")),
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 96},
)

GRANITE = ArchRow(
    # granite (granite.cpp): Granite 3.x dense's graph with its MoE branch (granitemoe's layers under the
    # dense name; Granite MoE releases ship as granitemoe) and a shared expert (Granite MoE Shared).
    name="granite",
    arch="granite",
    keys=(*MOE_KEYS, Key("feed_forward_length", "ff_exp"), Key("expert_shared_feed_forward_length", "ff_shexp"),
          *_GRANITE_KEYS),
    layer=(*_LLAMA_MOE, *SHEXP),
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64, "n_ff_shexp": 64},
    input_multiplier=lambda d: 12.0,
)

GRANITE_SWA = ArchRow(
    # granite_swa (granite-swa.cpp): Granite with sliding-window layers (every 4th full) and attention
    # sinks; its MoE branch with a fused gate+up shared expert (ffn_up_shexp twice as wide).
    name="granite_swa",
    arch="granite_swa",
    keys=(*MOE_KEYS, Key("feed_forward_length", "ff_exp"), Key("expert_shared_feed_forward_length", "ff_shexp"),
          *_GRANITE_KEYS, Key("attention.sliding_window", "swa"),
          Key("attention.sliding_window_pattern", swa_every_4th_full, "bool_arr")),
    layer=(*_LLAMA_MOE, _t("attn_sinks.weight", "head", init="sinks"),
           _t("ffn_up_shexp.weight", "embd", "2*ff_shexp"), _t("ffn_down_shexp.weight", "ff_shexp", "embd")),
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64, "n_ff_shexp": 64, "n_swa": 8},
    input_multiplier=lambda d: 12.0,
)

MINICPM = ArchRow(
    # minicpm (minicpm.cpp, Granite's graph): MiniCPM-MoE-8x2B; MiniCPM's scalars (embedding, residual
    # and logit scales), experts sized by feed_forward_length.
    name="minicpm",
    arch="minicpm",
    keys=(*MOE_KEYS, Key("feed_forward_length", "ff_exp"), Key("rope.dimension_count", "head_dim"),
          Key("embedding_scale", 12.0, "f32"), Key("residual_scale", 0.7, "f32"), Key("logit_scale", 0.25, "f32")),
    layer=_LLAMA_MOE,
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64},
    input_multiplier=lambda d: 12.0,
)

ROWS: tuple[ArchRow, ...] = (MISTRAL3, GRANITE, GRANITE_SWA, MINICPM)
