"""A separate draft model that reads its target's KV cache: Gemma 4's assistant (`gemma4-assistant`).

The target is the gemma4 trunk row of `arch_rows` (4 layers: three sliding-window, the last full, so
its last two are one sliding and one full, as the pinned `share` in src/llama-model.cpp needs); the
assistant is a second file, a small dense model as `src/models/gemma4-assistant.cpp` loads it:
`block_count` = `nextn_predict_layers` (every layer a next-n layer), `embedding_length_out` = the
target's width, `nextn.pre_projection` (`[2 * target embd, embd]`: the target's token embedding,
scaled by sqrt(target embd), concatenated with the target's hidden state), per layer a query-only
attention over the target's keys and values (sliding layers over the target's layer n_layer - 2, full
ones over n_layer - 1), a dense GELU FFN, `layer_output_scale`, and `nextn.post_projection` back to
the target's width (the hidden state the next draft takes). Its token embedding is its output matrix.

Heads (`head=`), as `mtp_rows`' heads:

- "agree": the pre-projection passes the target's token embedding through (`[I | 0]`, into the first
  target-width channels), both post-norms are zero (attention and FFN add nothing) and the output
  matrix is the target's, padded: the assistant predicts the bigram successor the trunk predicts.
- "noisy": "agree" with its attention and FFN switched on (unit post-norms, random weights: the
  target's keys and values now move the drafts) and random weights on the hidden-state half of the
  pre-projection: some drafts accepted, some rejected.
- "random": random weights: drafts mostly rejected.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from bmoe_edge.engine import info
from bmoe_edge.errors import BmoeError
from bmoe_edge.synthetic import tinymoe
from bmoe_edge.synthetic.arch_parts import swa_every_4th_full
from bmoe_edge.synthetic.draft_model import draft_model_of
from bmoe_edge.synthetic.gguf_kv import BASE_KEYS, Key, arch_kvs, full_vocab_size, general_kvs, vocab_kvs

NOISE = 6.0  # "noisy": the random hidden-state part of the pre-projection (against the embedding's EMBD_RMS)
LAYERS = ("swa", "full")  # the assistant's layers: the target's last two kinds, in their order
EXTRA_WIDTH = 64  # the assistant is this much wider than its target (it must differ: embedding_length_out)


def assistant_archs() -> dict[str, str]:
    """Target architecture -> its draft model's, from the engine's recipe rows (one declaration)."""
    return {r.architecture: r.draft_model for r in info.recipes() if r.draft_model}


def _assistant_tensors(row: Any, d: Any, seed: int, head: str, n_embd: int) -> list[tuple[str, Any]]:
    import numpy as np

    n_t, hd, ff = d.n_embd, d.head_dim, d.n_ff
    n_head = d.n_head

    def rand(name: str, *shape: int) -> Any:  # numpy [out, in]
        return tinymoe._init("weight", row, f"assistant.{name}", tuple(reversed(shape)), seed, d)

    _, target_output = tinymoe._embeddings(row, d, seed)
    pre = rand("nextn.pre_projection.weight", n_embd, 2 * n_t)
    output = rand("token_embd.weight", d.n_vocab, n_embd) * np.float32(tinymoe.LOGIT_SCALE / math.sqrt(n_embd))
    if head != "random":
        hidden = pre[:, n_t:] * np.float32(NOISE if head == "noisy" else 0.0)
        pre = np.zeros_like(pre)
        pre[:n_t, :n_t] = np.eye(n_t, dtype=np.float32)
        pre[:, n_t:] = hidden
        output = np.zeros((d.n_vocab, n_embd), dtype=np.float32)
        output[:, :n_t] = target_output
    post_norm = np.float32(0.0 if head == "agree" else 1.0)
    out: list[tuple[str, Any]] = [
        ("token_embd.weight", output),
        ("rope_freqs.weight", np.ones(hd // 2, dtype=np.float32)),
        ("nextn.pre_projection.weight", pre),
        ("nextn.post_projection.weight", rand("nextn.post_projection.weight", n_t, n_embd)),
    ]
    for il in range(len(LAYERS)):
        p = f"blk.{il}."
        out += [
            (p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32)),
            (p + "attn_q.weight", rand(p + "attn_q.weight", n_head * hd, n_embd)),
            (p + "attn_q_norm.weight", np.ones(hd, dtype=np.float32)),
            (p + "attn_output.weight", rand(p + "attn_output.weight", n_embd, n_head * hd)),
            (p + "post_attention_norm.weight", np.full(n_embd, post_norm, dtype=np.float32)),
            (p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32)),
            (p + "ffn_gate.weight", rand(p + "ffn_gate.weight", ff, n_embd)),
            (p + "ffn_up.weight", rand(p + "ffn_up.weight", ff, n_embd)),
            (p + "ffn_down.weight", rand(p + "ffn_down.weight", n_embd, ff)),
            (p + "post_ffw_norm.weight", np.full(n_embd, post_norm, dtype=np.float32)),
            (p + "layer_output_scale.weight", np.ones(1, dtype=np.float32)),
        ]
    out.append(("output_norm.weight", np.ones(n_embd, dtype=np.float32)))
    return out


def _assistant_kvs(target_arch: str, arch: str, d: Any, n_embd: int, quant: str) -> list[Any]:
    """The assistant's keys: the target row's attention geometry (its queries meet the target's keys),
    its own width and layers."""
    row = tinymoe.ROWS[target_arch]
    own = {"embedding_length", "block_count", "feed_forward_length", "attention.sliding_window_pattern",
           "expert_count", "expert_used_count", "expert_feed_forward_length"}
    keys = (*(k for k in (*BASE_KEYS, *row.keys) if k.name not in own),
            Key("embedding_length", n_embd), Key("block_count", len(LAYERS)),
            Key("feed_forward_length", "ff"), Key("embedding_length_out", "embd"),
            Key("nextn_predict_layers", len(LAYERS)),
            Key("attention.sliding_window_pattern", [k == "swa" for k in LAYERS], "bool_arr"))
    return [*general_kvs(f"bmoe-tiny-assistant-{target_arch}-{quant}", tinymoe._FILE_TYPE[quant],
                         quant not in ("F32", "F16")),
            *arch_kvs(arch, keys, d), *vocab_kvs(d.n_vocab)]


def write_target_and_assistant(path: Path, arch: str, quant: str, *, head: str = "agree", seed: int = 0,
                               n_layer: int = 4, n_embd: int | None = None, n_ff_exp: int | None = None,
                               n_expert: int | None = None) -> tuple[Path, Path]:
    """Write a tiny `arch` model in `quant` (the full vocabulary; bigger dimensions and more experts for
    measurements) and its assistant beside it (`draft_model_of`, in the same type: resident, nothing of it
    streams)."""
    targets = assistant_archs()
    if arch not in targets:
        raise BmoeError(f"no draft-model fixture for {arch!r} (known: {', '.join(targets)})")
    row = tinymoe.ROWS[arch]
    d = tinymoe.dims_for(arch, quant, n_layer=n_layer, n_embd=n_embd, n_ff_exp=n_ff_exp)
    d = replace(d, n_vocab=full_vocab_size(), **({"n_expert": n_expert} if n_expert else {}))
    if ["swa" if swa else "full" for swa in swa_every_4th_full(d)][-2:] != list(LAYERS):
        raise BmoeError(f"{arch} with {n_layer} layers does not end in a sliding then a full layer: the assistant "
                        "reads those two layers' keys and values")
    target = tinymoe._direct(Path(path), row, quant, d, seed, 1)[0]
    width = d.n_embd + EXTRA_WIDTH
    tensors = [(name, *tinymoe._encode(name, data, quant))
               for name, data in _assistant_tensors(row, d, seed, head, width)]
    kvs = _assistant_kvs(arch, targets[arch], d, width, quant)
    assistant = tinymoe._write_gguf(draft_model_of(target), targets[arch], kvs, tensors, 1)[0]
    return target, assistant
