"""Fixture rows of the DeepSeek-derived families at the pin (DeepSeek V4, ...): one data row each, from
the architecture's `load_arch_hparams` / `load_arch_tensors` in `src/models/<file>.cpp`. They join the
single table in `arch_rows` (`ROWS`).
"""

from __future__ import annotations

from dataclasses import replace

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
    ROUTER,
    SHEXP,
    SIGMOID,
    ArchRow,
    Dims,
    _t,
)
from bmoe_edge.synthetic.gguf_kv import Key

QKV_FULL = tuple(_t(f"attn_{x}.weight", "embd", "embd") for x in "qkv")  # multi-head, n_embd wide
SQRT_SOFTPLUS = 4  # llama_expert_gating_func_type: sqrt(softplus(logits)), DeepSeek V4's scoring
_RATIO = {"A": 0, "C": 4, "H": 128}  # Dims.kind -> attention.compress_ratios


def _compress_ratios(d: Dims) -> list[int]:
    return [_RATIO[d.kind(il)] for il in range(d.n_layer_all)]


def _hc(prefix: str) -> tuple:
    """A hyper-connection mixer (hc_attn_* / hc_ffn_*): kept in F32 as the converter writes them."""
    return (_t(f"{prefix}_fn.weight", "hc_dim", "hc_mix", f32=True),
            _t(f"{prefix}_base.weight", "hc_mix", init="bias", f32=True),
            _t(f"{prefix}_scale.weight", "3", init="bias", f32=True))


def _compressor(prefix: str, width: str, ratio: str, norm: str, mixer: str) -> tuple:
    return (_t(f"{prefix}_kv.weight", "embd", width, mixer=mixer),
            _t(f"{prefix}_gate.weight", "embd", width, mixer=mixer),
            _t(f"{prefix}_ape.weight", width, ratio, init="bias", mixer=mixer, f32=True),
            _t(f"{prefix}_norm.weight", norm, init="norm", mixer=mixer))


DEEPSEEK4 = ArchRow(
    # DeepSeek V4 (deepseek4.cpp): hyper-connections (hc_mult copies of the residual mixed per sub-layer
    # by hc_*_fn, a Sinkhorn-normalised combination), one shared-KV head with attention sinks, a
    # grouped low-rank output (attn_output_a/_b), compressed attention per layer (compress_ratios: 0 a
    # plain sliding window, 4 CSA with the lightning indexer, 128 HCA), sqrt-softplus routing with a
    # selection bias except in the leading hash layers (experts looked up by token id in
    # ffn_gate_tid2eid, no router scores), a shared expert; and one MTP block (nextn.*) after the trunk
    # in the same file, which the loader skips (load_mtp off) and generation never runs.
    name="deepseek4",
    arch="deepseek4",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), *HEAD_KEYS,
          Key("rope.dimension_count", "qk_rope"), Key("attention.q_lora_rank", "q_lora"),
          Key("attention.sliding_window", "swa"), Key("expert_shared_count", 1),
          Key("expert_weights_scale", 1.5, "f32"), Key("expert_weights_norm", True, "bool"),
          Key("swiglu_clamp_exp", lambda d: [10.0] * d.n_layer_all, "f32_arr"),
          Key("swiglu_clamp_shexp", lambda d: [10.0] * d.n_layer_all, "f32_arr"),
          Key("attention.indexer.head_count", "idx_heads"), Key("attention.indexer.key_length", "idx_dim"),
          Key("attention.indexer.top_k", 4),
          Key("attention.output_group_count", "o_groups"), Key("attention.output_lora_rank", "o_lora"),
          Key("attention.compress_ratios", _compress_ratios, "u32_arr"),
          Key("attention.compress_rope_freq_base", 160000.0, "f32"),
          Key("hyper_connection.count", "hc_mult"), Key("hyper_connection.sinkhorn_iterations", 3),
          Key("hyper_connection.epsilon", 1e-6, "f32"), Key("hash_layer_count", "n_hash"),
          Key("embedding_length_out", "hc_dim"), Key("nextn_predict_layers", "n_nextn"),
          Key("expert_gating_func", SQRT_SOFTPLUS)),
    layer=(*ATTN_NORM, _t("attn_sinks.weight", "head", init="sinks"),
           _t("attn_q_a.weight", "embd", "q_lora"), _t("attn_q_a_norm.weight", "q_lora", init="norm"),
           _t("attn_q_b.weight", "q_lora", "q"),
           _t("attn_kv.weight", "embd", "head_dim"), _t("attn_kv_a_norm.weight", "head_dim", init="norm"),
           # the file's shape; the loader reshapes it to {q / o_groups, o_lora, o_groups}
           _t("attn_output_a.weight", "q/o_groups", "o_groups*o_lora"),
           _t("attn_output_b.weight", "o_groups*o_lora", "embd"),
           *_hc("hc_attn"), *_hc("hc_ffn"),
           *_compressor("attn_compressor", "2*head_dim", "4", "head_dim", "csa"),
           *_compressor("attn_compressor", "head_dim", "128", "head_dim", "hca"),
           _t("indexer.proj.weight", "embd", "idx_heads", mixer="csa"),
           _t("indexer.attn_q_b.weight", "q_lora", "idx_heads*idx_dim", mixer="csa"),
           *_compressor("indexer_compressor", "2*idx_dim", "4", "idx_dim", "csa"),
           *ROUTER, _t("ffn_gate_tid2eid.weight", "expert_used", "vocab", init="tid2eid", where="hash"),
           _t("exp_probs_b.bias", "expert", init="bias", where="scored"),
           *FFN_NORM, *EXPERTS, *SHEXP,
           _t("nextn.eh_proj.weight", "2*embd", "embd", where="nextn"),
           _t("nextn.enorm.weight", "embd", init="norm", where="nextn"),
           _t("nextn.hnorm.weight", "embd", init="norm", where="nextn"),
           _t("nextn.shared_head_norm.weight", "embd", init="norm", where="nextn")),
    experts=EXPERT_SUFFIXES,
    model=(_t("output_hc_fn.weight", "hc_dim", "hc_mult", f32=True),
           _t("output_hc_base.weight", "hc_mult", init="bias", f32=True),
           _t("output_hc_scale.weight", "1", init="bias", f32=True)),
    # layers: a sliding-window one, CSA, HCA, CSA; then the MTP block (plain attention). Heads of 128 and
    # indexer heads of 64: the indexer's Hadamard rotation is at least 64 wide (real: 512 and 128). A
    # 16-token window: the prompts outgrow it.
    dims={"n_ff_exp": 64, "n_ff_shexp": 64, "n_head_kv": 1, "head_size": 128, "idx_dim": 64, "n_swa": 16,
          "kinds": "ACHCA", "n_hash": 1, "n_nextn": 1},
)

# The MTP block of the V3 layout (deepseek32, glm-dsa): a full decoder block plus the next-n wiring.
NEXTN = (_t("nextn.eh_proj.weight", "2*embd", "embd", where="nextn"),
         _t("nextn.enorm.weight", "embd", init="norm", where="nextn"),
         _t("nextn.hnorm.weight", "embd", init="norm", where="nextn"),
         _t("nextn.shared_head_norm.weight", "embd", init="norm", where="nextn"))

# DeepSeek-V3 layout with MLA (split attn_k_b / attn_v_b), as deepseek2's row, plus the DSA lightning
# indexer (its own k projection and layer norm, head weights, q from the q LoRA).
_MLA = (
    _t("attn_q_a.weight", "embd", "q_lora"), _t("attn_q_a_norm.weight", "q_lora", init="norm"),
    _t("attn_q_b.weight", "q_lora", "head*k_mla"),
    _t("attn_kv_a_mqa.weight", "embd", "kv_lora+rope"), _t("attn_kv_a_norm.weight", "kv_lora", init="norm"),
    _t("attn_k_b.weight", "qk_nope", "kv_lora", "head"), _t("attn_v_b.weight", "kv_lora", "v_mla", "head"))
_MLA_DSA_LAYER = (
    *ATTN_NORM, *_MLA,
    _t("attn_output.weight", "head*v_mla", "embd"),
    _t("indexer.k_norm.weight", "idx_dim", init="norm"), _t("indexer.k_norm.bias", "idx_dim", init="bias"),
    _t("indexer.proj.weight", "embd", "idx_heads"), _t("indexer.attn_k.weight", "embd", "idx_dim"),
    _t("indexer.attn_q_b.weight", "q_lora", "idx_heads*idx_dim"),
    *FFN_NORM, *DENSE_LEAD_FFN, *MOE_ONLY, *EXP_PROBS_B, *SHEXP, *NEXTN)

_MLA_DSA_KEYS = (
    *MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
    Key("leading_dense_block_count", "dense_lead"), Key("expert_shared_count", 1),
    Key("expert_weights_scale", 2.5, "f32"), Key("expert_weights_norm", True, "bool"),
    Key("expert_gating_func", SIGMOID),
    Key("attention.q_lora_rank", "q_lora"), Key("attention.kv_lora_rank", "kv_lora"),
    Key("attention.key_length", "kv_lora+rope"), Key("attention.value_length", "kv_lora"),
    Key("attention.key_length_mla", "k_mla"), Key("attention.value_length_mla", "v_mla"),
    Key("rope.dimension_count", "qk_rope"),
    Key("attention.indexer.head_count", "idx_heads"), Key("attention.indexer.key_length", "idx_dim"),
    Key("attention.indexer.top_k", 8), Key("nextn_predict_layers", "n_nextn"))

# A dense first layer, three MoE layers, one MTP block; indexer heads of 64 (the indexer's Hadamard
# rotation is at least 64 wide; real: 128), top-8 of the keys: the prompts outgrow it.
_MLA_DSA_DIMS = {"n_ff_exp": 64, "n_ff_shexp": 64, "n_dense_lead": 1, "n_head_kv": 1, "idx_dim": 64,
                 "n_nextn": 1}

DEEPSEEK32 = ArchRow(
    # DeepSeek V3.2 (-Exp, -Speciale; deepseek32.cpp): V3's MLA + MoE layers with DSA sparse attention
    # (the lightning indexer picks each query's top-k keys), sigmoid + bias routing, a shared expert, and
    # the MTP block in the same file (skipped by the loader: load_mtp off).
    name="deepseek32",
    arch="deepseek32",
    keys=_MLA_DSA_KEYS,
    layer=_MLA_DSA_LAYER,
    experts=EXPERT_SUFFIXES,
    dims=_MLA_DSA_DIMS,
)

# GLM-5 / 5.1 (glm-dsa.cpp): deepseek32's tensors under GLM's name; a 4096 training context means the
# pre-5.2 layout (every layer's indexer full, no indexer.types key).
GLM_DSA = replace(DEEPSEEK32, name="glm-dsa", arch="glm-dsa")

HY_V4 = ArchRow(
    # Tencent Hunyuan v4 (hy-v4.cpp): V3's MLA (attention sinks, a sigmoid output gate) with iHC
    # (independent hyper-connections: 4 residual copies, F32 mixers, a global head), DSA sparse attention
    # whose indexer only "full" layers own (indexer.types; a shared layer reuses the previous top-k),
    # sigmoid + bias routing with clamped routed swiglu, a dense first layer, a shared expert.
    name="hy_v4",
    arch="hy_v4",
    keys=(*(k for k in _MLA_DSA_KEYS if k.name != "nextn_predict_layers"),
          Key("attention.indexer.types", lambda d: [d.kind(il) != "S" for il in range(d.n_layer)], "bool_arr"),
          Key("swiglu_clamp_exp", lambda d: [10.0] * d.n_layer_all, "f32_arr"),
          Key("hyper_connection.count", "hc_mult"), Key("hyper_connection.epsilon", 1e-6, "f32"),
          Key("hyper_connection.magnitude", 1.0, "f32")),
    layer=(*ATTN_NORM, _t("attn_sinks.weight", "head", init="sinks"),
           *_MLA,
           _t("attn_output.weight", "head*v_mla", "embd"), _t("attn_gate.weight", "embd", "head*v_mla"),
           _t("indexer.attn_q_b.weight", "q_lora", "idx_heads*idx_dim", mixer="idx"),
           _t("indexer.attn_k.weight", "embd", "idx_dim", mixer="idx"),
           _t("indexer.k_norm.weight", "idx_dim", init="norm", mixer="idx"),
           _t("indexer.k_norm.bias", "idx_dim", init="bias", mixer="idx", f32=True),
           _t("indexer.proj.weight", "embd", "idx_heads", mixer="idx"),
           _t("hc_attn_fn.weight", "hc_dim", "2*hc_mult", f32=True),
           _t("hc_attn_base.weight", "2*hc_mult", init="bias", f32=True),
           _t("hc_attn_scale.weight", "2", init="bias", f32=True),
           _t("hc_ffn_fn.weight", "hc_dim", "2*hc_mult", f32=True),
           _t("hc_ffn_base.weight", "2*hc_mult", init="bias", f32=True),
           _t("hc_ffn_scale.weight", "2", init="bias", f32=True),
           *FFN_NORM, *DENSE_LEAD_FFN, *MOE_ONLY, *EXP_PROBS_B, *SHEXP),
    experts=EXPERT_SUFFIXES,
    model=(_t("output_hc_fn.weight", "hc_dim", "hc_mult", f32=True),
           _t("output_hc_base.weight", "hc_mult", init="bias", f32=True),
           _t("output_hc_scale.weight", "1", init="bias", f32=True)),
    # layers: MLA owning an indexer, MLA sharing it, and again (the first must own one); indexer heads of
    # 32 (wider than the rope part, as the loader requires)
    dims={"n_ff_exp": 64, "n_ff_shexp": 64, "n_dense_lead": 1, "n_head_kv": 1, "kinds": "ASAS", "idx_dim": 32},
)

def _mla(mixer: str, sfx: str = "") -> tuple:
    """An MLA block (q LoRA, a normed rope key, a head-wise sigmoid gate) of one layer kind; `sfx` "_swa"
    for the sliding-window geometry (its own latent, head sizes and head count)."""
    head = f"head{sfx}"
    return tuple(replace(t, mixer=mixer) for t in (
        _t("attn_q_a.weight", "embd", "q_lora"), _t("attn_q_a_norm.weight", "q_lora", init="norm"),
        _t("attn_q_b.weight", "q_lora", f"{head}*k_mla{sfx}"),
        _t("attn_kv_a_mqa.weight", "embd", f"kv_lora{sfx}+rope"),
        _t("attn_kv_a_norm.weight", f"kv_lora{sfx}", init="norm"),
        _t("attn_k_norm.weight", "qk_rope", init="norm"),
        _t("attn_k_b.weight", f"qk_nope{sfx}", f"kv_lora{sfx}", head),
        _t("attn_v_b.weight", f"kv_lora{sfx}", f"v_mla{sfx}", head),
        _t("attn_output.weight", f"{head}*v_mla{sfx}", "embd"), _t("attn_gate.weight", "embd", head)))


DOTS3NOTE = ArchRow(
    # dots.llm3 note (dots3note.cpp): MLA in two geometries, full-attention layers with the DSA indexer
    # and sliding-window layers with their own (smaller) latent and head sizes; a normed rope key and a
    # head-wise sigmoid gate; a dense first layer, sigmoid + bias routing, a shared expert; one MTP block
    # (sliding geometry, dense FFN) in the same file, which the loader skips.
    name="dots3note",
    arch="dots3note",
    keys=(*(k for k in _MLA_DSA_KEYS if k.name != "attention.indexer.top_k"), Key("attention.indexer.top_k", 8),
          Key("attention.head_count", Dims.heads_by_kind, "u32_arr"),
          Key("attention.sliding_window", "swa"),
          Key("attention.sliding_window_pattern", lambda d: [d.kind(il) == "W" for il in range(d.n_layer)],
              "bool_arr"),
          Key("rope.freq_base_swa", 10000.0, "f32"),
          Key("attention.kv_lora_rank_swa", "kv_lora_swa"), Key("attention.key_length_swa", "kv_lora_swa+rope"),
          Key("attention.value_length_swa", "kv_lora_swa"), Key("attention.key_length_mla_swa", "k_mla_swa"),
          Key("attention.value_length_mla_swa", "v_mla_swa"),
          Key("attention.indexer.types", lambda d: [d.kind(il) == "A" for il in range(d.n_layer)], "bool_arr")),
    layer=(*ATTN_NORM, *_mla("full"), *_mla("swa", "_swa"),
           *(replace(t, mixer="full", where="trunk") for t in _MLA_DSA_LAYER if t.name.startswith("indexer.")),
           *FFN_NORM, *(replace(t, where="dense_nextn") for t in DENSE_LEAD_FFN),
           *(replace(t, where="moe_trunk") for t in (*MOE_ONLY, *EXP_PROBS_B, *SHEXP)),
           *NEXTN[:3], _t("nextn.embed_tokens.weight", "embd", "vocab", where="nextn"), NEXTN[3]),
    experts=EXPERT_SUFFIXES,
    # full, sliding, sliding, full; the MTP block sliding; the sliding layers with twice the heads
    dims={**_MLA_DSA_DIMS, "kinds": "AWWAW", "n_swa": 8, "n_head_swa": 8},
)

DEEPSEEK2_OCR = ArchRow(
    # DeepSeek-OCR's language model (deepseek2ocr.cpp; the vision encoder is a separate mmproj): deepseek2's
    # MoE layout without MLA - plain multi-head attention with neox rope over the whole head, a dense
    # first layer, softmax routing, a shared expert. Generates from token ids like any decoder.
    name="deepseek2-ocr",
    arch="deepseek2-ocr",
    keys=(*MOE_KEYS, Key("expert_feed_forward_length", "ff_exp"), Key("feed_forward_length", "ff"),
          Key("leading_dense_block_count", "dense_lead"), Key("expert_shared_count", 1),
          Key("expert_weights_scale", 1.0, "f32"), Key("attention.head_count_kv", "head")),
    layer=(*QKV_FULL, _t("attn_output.weight", "embd", "embd"), *FFN_NORM, *ATTN_NORM, *DENSE_LEAD_FFN, *MOE_ONLY,
           *SHEXP),
    experts=EXPERT_SUFFIXES,
    dims={"n_ff_exp": 64, "n_ff_shexp": 64, "n_dense_lead": 1},
)

ROWS: tuple[ArchRow, ...] = (DEEPSEEK4, DEEPSEEK32, GLM_DSA, HY_V4, DOTS3NOTE, DEEPSEEK2_OCR)
