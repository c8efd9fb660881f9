"""Fixture rows of the DeepSeek-derived families at the pin (DeepSeek V4, ...): one data row each, from
the architecture's `load_arch_hparams` / `load_arch_tensors` in `src/models/<file>.cpp`. They join the
single table in `arch_rows` (`ROWS`).
"""

from __future__ import annotations

from bmoe_edge.synthetic.arch_parts import (
    ATTN_NORM,
    EXPERT_SUFFIXES,
    EXPERTS,
    FFN_NORM,
    HEAD_KEYS,
    MOE_KEYS,
    ROUTER,
    SHEXP,
    ArchRow,
    Dims,
    _t,
)
from bmoe_edge.synthetic.gguf_kv import Key

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

ROWS: tuple[ArchRow, ...] = (DEEPSEEK4,)
