"""Fixture rows of the older MoE families untested until the pin's sweep (Grok, Jamba): one data row each,
from `src/models/grok.cpp` and `jamba.cpp`. They join the single table in `arch_rows`.
"""

from __future__ import annotations

from dataclasses import replace

from bmoe_edge.synthetic.arch_parts import (
    ATTN_NORM,
    DENSE_FFN,
    EXPERT_SUFFIXES,
    EXPERTS,
    FFN_NORM,
    MOE_KEYS,
    QKV,
    ROUTER,
    ArchRow,
    Dims,
    _t,
)
from bmoe_edge.synthetic.gguf_kv import Key

GROK = ArchRow(
    # Grok (grok.cpp; Grok-1 314B, Grok-2): a norm after attention and after the FFN, attention / router /
    # final logit softcapping, Grok's embedding, attention-output and logit scales; Grok-2's dense MLP
    # beside the experts (optional to the loader, present here: Grok-1 has none).
    name="grok",
    arch="grok",
    keys=(*MOE_KEYS, Key("feed_forward_length", "ff"), Key("expert_feed_forward_length", "ff_exp"),
          Key("rope.dimension_count", "head_dim"), Key("logit_scale", 0.5, "f32"), Key("embedding_scale", 8.0, "f32"),
          Key("attention.output_scale", 0.5, "f32"), Key("attn_logit_softcapping", 30.0, "f32"),
          Key("router_logit_softcapping", 30.0, "f32"), Key("final_logit_softcapping", 30.0, "f32")),
    layer=(*ATTN_NORM, *QKV, _t("attn_output.weight", "embd", "embd"),
           _t("attn_output_norm.weight", "embd", init="norm"), *FFN_NORM, *DENSE_FFN, *ROUTER, *EXPERTS,
           _t("layer_output_norm.weight", "embd", init="norm")),
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64},
    input_multiplier=lambda d: 8.0,
)


def _alt(*ts, moe: bool):
    return tuple(replace(t, where="odd" if moe else "even") for t in ts)


JAMBA = ArchRow(
    # Jamba (jamba.cpp; Jamba v0.1 52B, Jamba 1.5 Mini / Large): Mamba (v1: ssm_x, dt / B / C norms) layers
    # and attention layers (head_count_kv 0 marks Mamba; every 4th here, 8th in the model), MoE every 2nd
    # layer (the others dense: the loader takes the router's presence per layer), experts sized by
    # feed_forward_length, d_inner = 2 x n_embd.
    name="jamba",
    arch="jamba",
    keys=(*MOE_KEYS, Key("feed_forward_length", "ff_exp"),
          Key("attention.head_count_kv", Dims.head_kv_per_layer, "u32_arr"),
          Key("ssm.conv_kernel", "ssm_conv"), Key("ssm.inner_size", "2*embd"), Key("ssm.state_size", "ssm_state"),
          Key("ssm.time_step_rank", "dt_rank")),
    layer=(*ATTN_NORM,
           *(replace(t, mixer="recr") for t in (
               _t("ssm_in.weight", "embd", "4*embd"), _t("ssm_conv1d.weight", "ssm_conv", "2*embd"),
               _t("ssm_conv1d.bias", "2*embd", init="bias"), _t("ssm_x.weight", "2*embd", "dt_rank+2*state"),
               _t("ssm_dt_norm.weight", "dt_rank", init="norm"), _t("ssm_dt.weight", "dt_rank", "2*embd"),
               _t("ssm_dt.bias", "2*embd", init="bias"), _t("ssm_b_norm.weight", "ssm_state", init="norm"),
               _t("ssm_c_norm.weight", "ssm_state", init="norm"), _t("ssm_a", "ssm_state", "2*embd", init="decay"),
               _t("ssm_d", "2*embd", init="norm"), _t("ssm_out.weight", "2*embd", "embd"))),
           *(replace(t, mixer="attn") for t in (*QKV, _t("attn_output.weight", "embd", "embd"))),
           *FFN_NORM,
           *_alt(*(replace(t, ne=tuple("ff_exp" if s == "ff" else s for s in t.ne)) for t in DENSE_FFN), moe=False),
           *_alt(*ROUTER, *EXPERTS, moe=True)),
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64, "kinds": "RRRA"},
)

ROWS: tuple[ArchRow, ...] = (GROK, JAMBA)
