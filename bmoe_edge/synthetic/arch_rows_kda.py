"""Fixture rows of the KDA hybrids at the pin (Kimi K3, Kimi-Linear, GLM-5-Next, Ling 3): KDA (Kimi
delta attention, recurrent) layers between MLA layers; one data row each, from `src/models/kimi-k3.cpp`,
`kimi-linear.cpp`, `glm5-next.cpp` and `bailingmoe3.cpp`. They join the single table in `arch_rows`.
"""

from __future__ import annotations

from dataclasses import replace

from bmoe_edge.synthetic.arch_parts import (
    ATTN_NORM,
    DENSE_LEAD_FFN,
    EXP_PROBS_B,
    EXPERT_SUFFIXES,
    FFN_NORM,
    MOE_KEYS,
    MOE_ONLY,
    SHEXP,
    SIGMOID,
    ArchRow,
    Dims,
    _t,
)
from bmoe_edge.synthetic.gguf_kv import Key


def _recr(*ts):
    return tuple(replace(t, mixer="recr") for t in ts)


def _attn(*ts):
    return tuple(replace(t, mixer="attn") for t in ts)


# KDA: short convolutions on q, k, v (3-D, as a quantized file stores them), a low-rank forget gate
# (ssm_f_a/_b), beta per head, decay per head, and an output gate before the gated RMS norm.
_KDA = _recr(
    _t("ssm_conv1d_q.weight", "ssm_conv", "1", "kda_inner"),
    _t("ssm_conv1d_k.weight", "ssm_conv", "1", "kda_inner"),
    _t("ssm_conv1d_v.weight", "ssm_conv", "1", "kda_inner"),
    _t("attn_q.weight", "embd", "kda_inner"), _t("attn_k.weight", "embd", "kda_inner"),
    _t("attn_v.weight", "embd", "kda_inner"),
    _t("ssm_f_a.weight", "embd", "kda_dim"), _t("ssm_f_b.weight", "kda_dim", "kda_inner"),
    _t("ssm_beta.weight", "embd", "head"),
    _t("ssm_dt.bias", "kda_inner", init="bias"),
    _t("ssm_norm.weight", "kda_dim", init="norm"),
    _t("attn_output.weight", "kda_inner", "embd"))

# MLA served as MQA (split attn_k_b / attn_v_b), as deepseek2's row.
_MLA_KV = _attn(
    _t("attn_kv_a_mqa.weight", "embd", "kv_lora+rope"), _t("attn_kv_a_norm.weight", "kv_lora", init="norm"),
    _t("attn_k_b.weight", "qk_nope", "kv_lora", "head"), _t("attn_v_b.weight", "kv_lora", "v_mla", "head"),
    _t("attn_output.weight", "head*v_mla", "embd"))

# K3's routed experts live in the latent space: their rows are `latent` wide, not n_embd.
LATENT_EXPERTS = (
    _t("ffn_gate_exps.weight", "latent", "ff_exp", "expert", where="moe"),
    _t("ffn_up_exps.weight", "latent", "ff_exp", "expert", where="moe"),
    _t("ffn_down_exps.weight", "ff_exp", "latent", "expert", where="moe"))
ROUTER_MOE = (_t("ffn_gate_inp.weight", "embd", "expert", where="moe"),)

_KEYS = (*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
         Key("attention.head_count_kv", Dims.head_kv_per_layer, "u32_arr"),
         Key("attention.kv_lora_rank", "kv_lora"), Key("attention.key_length", "kv_lora+rope"),
         Key("attention.key_length_mla", "k_mla"), Key("attention.value_length_mla", "v_mla"),
         Key("rope.dimension_count", "qk_rope"),
         Key("ssm.conv_kernel", "ssm_conv"), Key("kda.head_dim", "kda_dim"),
         Key("leading_dense_block_count", "dense_lead"), Key("expert_shared_count", 1),
         Key("expert_weights_scale", 2.5, "f32"), Key("expert_gating_func", SIGMOID))

# KDA, KDA, KDA, MLA (the real models' 3:1), the first layer dense. head_count_kv: 0 marks a KDA layer,
# 1 an MLA one (its cache holds one latent head; with n_head there the graph's cache write aborts).
_DIMS = {"n_ff_exp": 64, "n_ff_shexp": 64, "n_dense_lead": 1, "n_head_kv": 1, "kinds": "RRRA"}

KIMI_LINEAR = ArchRow(
    # Kimi-Linear-48B-A3B (kimi-linear.cpp): KDA layers with a low-rank output gate (ssm_g_a/_b) and
    # a padded 2-D decay, MLA layers without a q LoRA, sigmoid + bias routing, a shared expert.
    name="kimi-linear",
    arch="kimi-linear",
    keys=_KEYS,
    layer=(*ATTN_NORM, *_KDA,
           *_recr(_t("ssm_a", "1", "head", init="decay"),
                  _t("ssm_g_a.weight", "embd", "kda_dim"), _t("ssm_g_b.weight", "kda_dim", "kda_inner")),
           *_attn(_t("attn_q.weight", "embd", "head*k_mla")), *_MLA_KV,
           *FFN_NORM, *DENSE_LEAD_FFN, *MOE_ONLY, *EXP_PROBS_B, *SHEXP),
    experts=EXPERT_SUFFIXES,
    dims=_DIMS,
)

KIMI_K3 = ArchRow(
    # Kimi K3 (kimi-k3.cpp): KDA layers with a full-rank output gate (ssm_g) and a 1-D decay; MLA layers
    # with a q LoRA and a sigmoid output gate (attn_gate); latent experts (routed in a 32-wide space
    # between ffn_routed_down and ffn_routed_up); situ activation; cross-layer attention residuals
    # (attn_res.block_size 2: res scores per sub-layer and before the head); sigmoid + bias routing.
    name="kimi-k3",
    arch="kimi-k3",
    keys=(*_KEYS, Key("attention.q_lora_rank", "q_lora"), Key("attention.value_length", "kv_lora"),
          Key("expert_weights_norm", True, "bool"), Key("expert_latent_length", "latent"),
          Key("attn_res.block_size", 2), Key("activation.situ_beta", 4.0, "f32"),
          Key("activation.situ_linear_beta", 4.0, "f32")),
    layer=(*ATTN_NORM, _t("attn_res_score.weight", "embd", init="bias"),
           _t("ffn_res_score.weight", "embd", init="bias"), *_KDA,
           *_recr(_t("ssm_a", "head", init="decay"), _t("ssm_g.weight", "embd", "kda_inner")),
           *_attn(_t("attn_q_a.weight", "embd", "q_lora"), _t("attn_q_a_norm.weight", "q_lora", init="norm"),
                  _t("attn_q_b.weight", "q_lora", "head*k_mla"), _t("attn_gate.weight", "embd", "head*v_mla")),
           *_MLA_KV, *FFN_NORM, *DENSE_LEAD_FFN, *ROUTER_MOE, *LATENT_EXPERTS, *EXP_PROBS_B,
           _t("ffn_routed_down.weight", "embd", "latent", where="moe"),
           _t("ffn_routed_up.weight", "latent", "embd", where="moe"),
           _t("ffn_routed_norm.weight", "latent", init="norm", where="moe"), *SHEXP),
    experts=EXPERT_SUFFIXES,
    model=(_t("output_res_score.weight", "embd", init="bias"),),
    dims=_DIMS,
)

def _hc(prefix: str) -> tuple:
    """A hyper-connection mixer of a trunk layer (hc_attn_* / hc_ffn_*), kept in F32 as the converter does."""
    return (_t(f"{prefix}_fn.weight", "hc_dim", "hc_mix", where="trunk", f32=True),
            _t(f"{prefix}_base.weight", "hc_mix", init="bias", where="trunk", f32=True),
            _t(f"{prefix}_scale.weight", "3", init="bias", where="trunk", f32=True))


GLM5_NEXT = ArchRow(
    # GLM-5-Next (glm5-next.cpp): KDA layers (low-rank output gate, 1-D decay) between nope-only MLA
    # layers (no rope part) with the DSA indexer over k-pools (kpool 2, top-4; a layer marked shared in
    # indexer.types reuses the previous layer's selection); mHC (4 residual copies, Sinkhorn mixing)
    # around every trunk sub-layer; sigmoid + bias routing, dense first layer, shared expert; one MTP
    # block in the same file (an MLA layer with a full indexer, skipped by the loader).
    name="glm5-next",
    arch="glm5-next",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
          Key("attention.head_count_kv", Dims.head_kv_per_layer, "u32_arr"),
          Key("attention.layer_norm_epsilon", 1e-6, "f32"),
          Key("attention.q_lora_rank", "q_lora"), Key("attention.kv_lora_rank", "kv_lora"),
          Key("rope.dimension_count", "qk_rope"), Key("attention.key_length", "kv_lora+rope"),
          Key("attention.value_length", "kv_lora"),
          Key("attention.key_length_mla", "k_mla"), Key("attention.value_length_mla", "v_mla"),
          Key("ssm.conv_kernel", "ssm_conv"), Key("kda.head_dim", "kda_dim"),
          Key("attention.indexer.head_count", "idx_heads"), Key("attention.indexer.key_length", "idx_dim"),
          Key("attention.indexer.top_k", 4), Key("attention.indexer.kpool", 2),
          Key("attention.indexer.kpool_select_tail", True, "bool"),
          Key("attention.indexer.types", lambda d: [d.kind(il) != "S" for il in range(d.n_layer)], "bool_arr"),
          Key("hyper_connection.count", "hc_mult"), Key("hyper_connection.sinkhorn_iterations", 3),
          Key("hyper_connection.epsilon", 1e-6, "f32"),
          Key("leading_dense_block_count", "dense_lead"), Key("expert_shared_count", 1),
          Key("expert_weights_scale", 2.5, "f32"), Key("expert_weights_norm", True, "bool"),
          Key("swiglu_clamp_exp", lambda d: [10.0] * d.n_layer_all, "f32_arr"),
          Key("swiglu_clamp_shexp", lambda d: [10.0] * d.n_layer_all, "f32_arr"),
          Key("nextn_predict_layers", "n_nextn")),
    layer=(*ATTN_NORM, *FFN_NORM, *_hc("hc_attn"), *_hc("hc_ffn"), *_KDA,
           *_recr(_t("ssm_a", "head", init="decay"),
                  _t("ssm_g_a.weight", "embd", "kda_dim"), _t("ssm_g_b.weight", "kda_dim", "kda_inner")),
           *_attn(_t("attn_q_a.weight", "embd", "q_lora"), _t("attn_q_a_norm.weight", "q_lora", init="norm"),
                  _t("attn_q_b.weight", "q_lora", "head*k_mla")), *_MLA_KV,
           *(replace(t, mixer="idx") for t in (
               _t("indexer.k_norm.weight", "idx_dim", init="norm"), _t("indexer.k_norm.bias", "idx_dim", init="bias"),
               _t("indexer.proj.weight", "embd", "idx_heads"), _t("indexer.attn_k.weight", "embd", "idx_dim"),
               _t("indexer.attn_q_b.weight", "q_lora", "idx_heads*idx_dim"),
               _t("indexer_compressor_gate.weight", "embd", "idx_dim", f32=True),
               _t("indexer_compressor_ape.weight", "idx_dim", "2", init="bias", f32=True))),
           *DENSE_LEAD_FFN, *MOE_ONLY, *EXP_PROBS_B, *SHEXP,
           _t("nextn.eh_proj.weight", "2*embd", "embd", where="nextn"),
           _t("nextn.enorm.weight", "embd", init="norm", where="nextn"),
           _t("nextn.hnorm.weight", "embd", init="norm", where="nextn"),
           _t("nextn.shared_head_norm.weight", "embd", init="norm", where="nextn")),
    experts=EXPERT_SUFFIXES,
    # KDA (dense FFN), MLA with a full indexer, KDA, MLA sharing it; then the MTP block (MLA, full indexer)
    dims={**_DIMS, "kinds": "RARSA", "qk_rope": 0, "idx_dim": 64, "n_nextn": 1},
)

BAILINGMOE3 = ArchRow(
    # Ling 3 / Ring 3 (bailingmoe3.cpp): KDA layers with full-rank forget and output gates (ssm_f_a,
    # ssm_g_a; 4-D short convolutions, a safe gate with a negative lower bound) between MLA layers without
    # a q LoRA and with a head-wise output gate, a dense first layer, sigmoid + bias routing, a shared
    # expert; one MTP block in the same file (MLA + MoE, skipped by the loader).
    name="bailingmoe3",
    arch="bailingmoe3",
    keys=(*(k for k in _KEYS if k.name != "expert_weights_scale"), Key("expert_weights_scale", 2.5, "f32"),
          Key("expert_weights_norm", True, "bool"), Key("expert_shared_feed_forward_length", "ff_shexp"),
          Key("kda.safe_gate", True, "bool"), Key("kda.gate_lower_bound", -5.0, "f32"),
          Key("nextn_predict_layers", "n_nextn")),
    layer=(*ATTN_NORM,
           *_recr(*(replace(t, ne=(*t.ne, "1")) for t in _KDA[:3]), *_KDA[3:6],
                  _t("ssm_f_a.weight", "embd", "kda_inner"), _t("ssm_beta.weight", "embd", "head"),
                  _t("ssm_a", "1", "head", init="decay"), _t("ssm_dt.bias", "kda_inner", init="bias"),
                  _t("ssm_g_a.weight", "embd", "kda_inner"), _t("ssm_norm.weight", "kda_dim", init="norm"),
                  _t("attn_output.weight", "kda_inner", "embd")),
           *_attn(_t("attn_q.weight", "embd", "head*k_mla"), _t("attn_gate.weight", "embd", "head")), *_MLA_KV,
           *FFN_NORM, *DENSE_LEAD_FFN, *MOE_ONLY, *EXP_PROBS_B, *SHEXP,
           _t("nextn.eh_proj.weight", "2*embd", "embd", where="nextn"),
           _t("nextn.enorm.weight", "embd", init="norm", where="nextn"),
           _t("nextn.hnorm.weight", "embd", init="norm", where="nextn"),
           _t("layer_output_norm.weight", "embd", init="norm", where="nextn")),
    experts=EXPERT_SUFFIXES,
    dims={**_DIMS, "kinds": "RRRAA", "n_nextn": 1},
)

ROWS: tuple[ArchRow, ...] = (KIMI_K3, KIMI_LINEAR, GLM5_NEXT, BAILINGMOE3)
