"""Fixture rows of sliding-window MoE models at the pin (MiMo-V2, Step-3.5, Laguna, Maple): one data row
each, from `src/models/mimo2.cpp`, `step35.cpp`, `laguna.cpp` and `maple.cpp`. They join the single
table in `arch_rows`.
"""

from __future__ import annotations

from bmoe_edge.synthetic.arch_parts import (
    ATTN_NORM,
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
    Dims,
    _t,
    swa_every_4th_full,
)
from bmoe_edge.synthetic.gguf_kv import Key


def _swa_kinds(d: Dims) -> list[bool]:
    """attention.sliding_window_pattern from the layer kinds: "W" layers slide (MTP blocks too, as the
    converters pad the pattern)."""
    return [d.kind(il) == "W" for il in range(d.n_layer_all)]


def _attn_by_kind(gate: bool = False) -> tuple:
    """q/k/v/output (and a per-head gate) of full ("A") and sliding-window ("W") layers, whose head counts
    differ (head_count / head_count_kv arrays)."""
    out = []
    for mixer, sfx in (("full", ""), ("swa", "_swa")):
        out += [_t("attn_q.weight", "embd", f"q{sfx}", mixer=mixer),
                _t("attn_k.weight", "embd", f"kv{sfx}", mixer=mixer),
                _t("attn_v.weight", "embd", f"kv{sfx}", mixer=mixer),
                _t("attn_output.weight", f"q{sfx}", "embd", mixer=mixer)]
        if gate:
            out.append(_t("attn_gate.weight", "embd", f"head{sfx}", mixer=mixer))
    return tuple(out)


_NEXTN = (_t("nextn.eh_proj.weight", "2*embd", "embd", where="nextn"),
          _t("nextn.enorm.weight", "embd", init="norm", where="nextn"),
          _t("nextn.hnorm.weight", "embd", init="norm", where="nextn"),
          _t("nextn.shared_head_norm.weight", "embd", init="norm", where="nextn"))

MIMO2 = ArchRow(
    # MiMo-V2-Flash (mimo2.cpp): sliding-window layers (every 4th full here) with attention sinks, value
    # heads narrower than key heads (value_length 8, key 16), partial rope, a value scale, a dense first
    # layer, then sigmoid + bias routing (no shared expert); one MTP block in the same file (skipped by
    # the loader: load_mtp off). The sliding-window layers have their own kv head count (head_count_kv).
    name="mimo2",
    arch="mimo2",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
          Key("attention.key_length", "head_dim"), Key("attention.value_length", "v_head"),
          Key("attention.head_count_kv", Dims.heads_kv_by_kind, "u32_arr"),
          Key("rope.dimension_count", "head_dim/2"), Key("attention.sliding_window", "swa"),
          Key("attention.sliding_window_pattern", _swa_kinds, "bool_arr"),
          Key("rope.freq_base_swa", 10000.0, "f32"), Key("attention.value_scale", 0.75, "f32"),
          Key("leading_dense_block_count", "dense_lead"), Key("nextn_predict_layers", "n_nextn")),
    layer=(QKV[0], _t("attn_output.weight", "head*v_head", "embd"),
           *(t for mixer, sfx in (("full", ""), ("swa", "_swa")) for t in (
               _t("attn_k.weight", "embd", f"kv{sfx}", mixer=mixer),
               _t("attn_v.weight", "embd", f"kv_v{sfx}", mixer=mixer))),
           *ATTN_NORM, _t("attn_sinks.weight", "head", init="sinks"), *FFN_NORM,
           *DENSE_LEAD_FFN, *MOE_ONLY, *EXP_PROBS_B, *_NEXTN),
    experts=EXPERT_SUFFIXES,
    # sliding, sliding, sliding, full; the MTP block sliding; the sliding layers with twice the kv heads
    dims={"n_ff_exp": 64, "n_dense_lead": 1, "n_swa": 8, "v_head": 8, "n_nextn": 1, "kinds": "WWWAW",
          "n_head_kv_swa": 4},
)

STEP35 = ArchRow(
    # Step-3.5-Flash (step35.cpp): sliding-window layers (every 4th full, with half the rope dims),
    # q/k head norms, a head-wise sigmoid attention gate (attn_gate: one per head), a dense first layer,
    # then sigmoid + bias routing with a shared expert and clamped swiglu; one MTP block in the same file.
    # The MTP block's optional tensors (q/k norms, its FFN and experts) are not marked skippable in the
    # loader: llama.cpp maps them though load_mtp is off; no graph uses them, so they are never read.
    # Sliding-window layers with twice the heads and kv heads of the full ones (head_count arrays).
    name="step35",
    arch="step35",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
          Key("expert_shared_feed_forward_length", "ff_shexp"), *HEAD_KEYS,
          Key("attention.head_count", Dims.heads_by_kind, "u32_arr"),
          Key("attention.head_count_kv", Dims.heads_kv_by_kind, "u32_arr"),
          Key("attention.sliding_window", "swa"),
          Key("attention.sliding_window_pattern", _swa_kinds, "bool_arr"),
          Key("expert_gating_func", SIGMOID), Key("expert_weights_scale", 1.0, "f32"),
          Key("expert_weights_norm", True, "bool"), Key("leading_dense_block_count", "dense_lead"),
          Key("swiglu_clamp_exp", lambda d: [7.0] * d.n_layer + [0.0] * d.n_nextn, "f32_arr"),
          Key("swiglu_clamp_shexp", lambda d: [16.0] * d.n_layer + [0.0] * d.n_nextn, "f32_arr"),
          Key("nextn_predict_layers", "n_nextn")),
    layer=(*ATTN_NORM, *QK_HEAD_NORM, *_attn_by_kind(gate=True), *FFN_NORM, *DENSE_LEAD_FFN, *MOE_ONLY,
           *EXP_PROBS_B, *SHEXP, *_NEXTN),
    experts=EXPERT_SUFFIXES,
    # sliding, sliding, sliding, full; the MTP block sliding
    dims={"n_ff_exp": 64, "n_ff_shexp": 64, "n_dense_lead": 1, "n_swa": 8, "n_nextn": 1, "kinds": "WWWAW",
          "n_head_swa": 8, "n_head_kv_swa": 4},
)

LAGUNA = ArchRow(
    # Laguna (laguna.cpp; XS.2 30B-A3B, S.2 118B-A8B, M.1 230B-A10B): XS.2's hybrid layout, a full layer
    # then three sliding-window ones (the loader's period 4, full first; SWA layers with their own rope
    # dims), q/k head norms, a per-head attention output gate, a dense first layer, sigmoid + bias
    # routing, an always-on shared expert. The sliding-window layers have more heads than the full ones
    # (64 vs 48 in XS.2; 8 vs 4 here), the kv heads are uniform.
    name="laguna",
    arch="laguna",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
          Key("expert_shared_feed_forward_length", "ff_shexp"), *HEAD_KEYS,
          Key("leading_dense_block_count", "dense_lead"), Key("expert_weights_scale", 1.0, "f32"),
          Key("expert_weights_norm", True, "bool"), Key("attention.sliding_window", "swa"),
          Key("rope.dimension_count", "head_dim/2"), Key("rope.dimension_count_swa", "head_dim"),
          Key("attention.head_count", Dims.heads_by_kind, "u32_arr")),
    layer=(*ATTN_NORM, *_attn_by_kind(gate=True), *QK_HEAD_NORM, *FFN_NORM, *DENSE_LEAD_FFN, *MOE_ONLY,
           *EXP_PROBS_B, *SHEXP),
    experts=EXPERT_SUFFIXES,
    # full, then three sliding-window layers: the loader's period-4 pattern, full first
    dims={"n_ff_exp": 64, "n_ff_shexp": 96, "n_dense_lead": 1, "n_swa": 8, "kinds": "AWWW", "n_head_swa": 8},
)

MAPLE = ArchRow(
    # Maple (maple.cpp; the 20B llama.cpp names): sliding-window layers with rope and full layers without
    # (NoPE; every 4th full here), q/k head norms, softmax routing with normalised weights, clamped swiglu
    # experts, no shared expert.
    name="maple",
    arch="maple",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), *HEAD_KEYS, Key("attention.sliding_window", "swa"),
          Key("attention.sliding_window_pattern", swa_every_4th_full, "bool_arr"),
          Key("rope.freq_base_swa", 10000.0, "f32"),
          Key("swiglu_clamp_exp", lambda d: [7.0] * d.n_layer_all, "f32_arr")),
    layer=(*ATTN_NORM, *QKV, _t("attn_output.weight", "q", "embd"), *QK_HEAD_NORM, *FFN_NORM, *ROUTER, *EXPERTS),
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64, "n_swa": 8},
)

ROWS: tuple[ArchRow, ...] = (MIMO2, STEP35, LAGUNA, MAPLE)
