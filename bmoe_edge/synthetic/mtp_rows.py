"""Tiny fixtures with a model's own draft heads: MTP (next-n) blocks after the trunk.

A trunk row of `arch_rows` (4 layers) gets MTP blocks after it, `blk.4` (and `blk.5`, ... for chained
heads), which llama.cpp loads as the model's MTP heads (`<arch>.nextn_predict_layers` = the heads,
`block_count` = trunk + heads) and runs only in a context of type MTP: the row's own layer tensors
(attention, router, routed experts: a block's experts stream like any layer's) plus the next-n
tensors `nextn.eh_proj` (`[2*embd, embd]`: the token's normed embedding and the hidden state,
concatenated, projected back), `nextn.enorm` and `nextn.hnorm`. A head predicts with the model's
output norm and matrix.

Three heads (`head=`):

- "agree": each block is a copy of the trunk's last layer of its kind and `eh_proj` passes the
  token's embedding through at the trunk's input scale (`[EMBD_RMS * I | 0]`). The trunk is a noisy
  bigram chain (tinymoe: each token's successor dominates its logits), so the head predicts what the
  model will: most drafts are accepted (the upper side of speculation, for measurements).
- "noisy": the "agree" head with random weights added to `eh_proj`: some drafts accepted, some
  rejected, often within one step (the verify step's partial cut, the head's context cut with it).
- "random": random weights like the rest of the fixture: drafts are mostly rejected (the lower
  side: the draft policy must back off).

Architectures (`MTP_ARCHS`, with their heads): the fixture rows whose pinned llama.cpp graph runs MTP
heads over the target model itself (`graph_mtp` in `src/models/<arch>.cpp`): glm4moe (GLM-4.5 style,
attention only) and qwen35moe (Qwen3.5/3.6-MoE: a hybrid trunk whose recurrent state the verify step
cuts back from llama.cpp's per-position snapshots; the head is an attention layer), one head each;
step35 (Step 3.5 Flash: chained heads, one trained block per draft step, selected with
`llama_set_nextn_layer_offset`; three here, sliding-window layers as in the row). gemma4's drafts
come from a separate assistant model (gemma4-assistant), not from blocks in the file: `mtp_fixture`
writes it beside its target (`assistant_rows`, `draft_model.draft_model_of`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bmoe_edge.errors import BmoeError
from bmoe_edge.synthetic import assistant_rows, tinymoe
from bmoe_edge.synthetic.arch_parts import EMBD_RMS
from bmoe_edge.synthetic.draft_model import draft_model_of
from bmoe_edge.synthetic.gguf_kv import KV, arch_kvs, full_vocab_size, general_kvs, vocab_kvs

# architecture -> its fixture's MTP heads (more than one: chained, head i drafts step i)
MTP_HEADS: dict[str, int] = {"glm4moe": 1, "qwen35moe": 1, "step35": 3}
MTP_ARCHS: tuple[str, ...] = tuple(MTP_HEADS)
HEADS: tuple[str, ...] = ("agree", "noisy", "random")
NOISE = 6.0  # "noisy": the random part of eh_proj (against the embedding's EMBD_RMS): about half accepted
TRUNK_LAYERS = 4


def _check(arch: str, quant: str, head: str) -> None:
    known = (*MTP_ARCHS, *assistant_rows.assistant_archs())
    if arch not in known:
        raise BmoeError(f"no MTP fixture for {arch!r} (known: {', '.join(known)})")
    if quant not in tinymoe.DIRECT_QUANTS:
        raise BmoeError(f"MTP fixtures come in {', '.join(tinymoe.DIRECT_QUANTS)}, not {quant!r}")
    if head not in HEADS:
        raise BmoeError(f"unknown MTP head {head!r} (known: {', '.join(HEADS)})")


_NEXTN_WIRING = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")  # written below


def _head_dims(row: Any, d: Any) -> Any:
    """The dimensions the heads' layers are made with: a row that declares its MTP blocks (step35)
    places them by its own layer pattern; else a head is an attention layer (also after a hybrid trunk:
    qwen35moe)."""
    return d if "n_nextn" in row.dims else replace(d, kinds="A")


def _head_tensors(row: Any, d: Any, seed: int, head: str, trunk: dict[str, Any], il: int) -> list[tuple[str, Any]]:
    import numpy as np

    head_dims = _head_dims(row, d)
    # "agree": the trunk's last layer of the head's kind (a sliding-window head copies a sliding layer)
    src = max(j for j in range(d.n_layer) if head_dims.kind(j) == head_dims.kind(il))
    out: list[tuple[str, Any]] = []
    for t in row.layer:
        if not t.in_layer(il, head_dims) or t.name in _NEXTN_WIRING:
            continue
        name = f"blk.{il}.{t.name}"
        if head != "random" and f"blk.{src}.{t.name}" in trunk:
            out.append((name, trunk[f"blk.{src}.{t.name}"].copy()))
        else:
            ne = tuple(d.value(s) for s in t.ne)
            out.append((name, tinymoe._init(t.init, row, name, ne, seed, d)))
    n = d.n_embd
    eh = tinymoe._init("weight", row, f"blk.{il}.nextn.eh_proj.weight", (2 * n, n), seed, d)
    if head != "random":  # numpy [out, in]: in = (enorm(embd) | hnorm(h))
        eh = eh * np.float32(NOISE) if head == "noisy" else np.zeros_like(eh)
        eh[:, :n] += np.eye(n, dtype=np.float32) * np.float32(EMBD_RMS)
    out += [(f"blk.{il}.nextn.eh_proj.weight", eh),
            (f"blk.{il}.nextn.enorm.weight", np.ones(n, dtype=np.float32)),
            (f"blk.{il}.nextn.hnorm.weight", np.ones(n, dtype=np.float32))]
    return out


def write_mtp_moe(path: Path, arch: str, quant: str, *, head: str = "agree", seed: int = 0,
                  n_layer: int = TRUNK_LAYERS, n_embd: int | None = None, n_ff_exp: int | None = None,
                  n_expert: int | None = None, vocab_size: int | None = None) -> Path:
    """Write a tiny `arch` model in `quant` with its MTP blocks (`MTP_HEADS`) after its `n_layer` trunk
    layers (bigger dimensions and more experts than the gate fixtures' for measurements)."""
    import gguf

    _check(arch, quant, head)
    heads = MTP_HEADS[arch]
    row = tinymoe.ROWS[arch]
    d = tinymoe.dims_for(arch, quant, n_layer=n_layer, n_embd=n_embd, n_ff_exp=n_ff_exp)
    d = replace(d, n_vocab=full_vocab_size() if vocab_size is None else vocab_size, n_nextn=heads)
    if n_ff_exp is not None:  # glm4moe's shared expert is n_ff_exp wide (expert_shared_count 1)
        d = replace(d, n_ff_shexp=n_ff_exp)
    if n_expert is not None:
        d = replace(d, n_expert=n_expert)
    tensors = tinymoe._model_tensors(row, replace(d, n_nextn=0), seed)
    trunk = dict(tensors)
    for il in range(n_layer, n_layer + heads):  # before output_norm/output
        tensors[-2:-2] = _head_tensors(row, d, seed, head, trunk, il)
    if "n_nextn" in row.dims:  # the row's keys count its MTP blocks (block_count, the per-layer arrays)
        kvs = arch_kvs(row.arch, row.keys, d)
    else:
        kvs = arch_kvs(row.arch, row.keys, replace(d, n_layer=n_layer + heads, n_nextn=0))  # trunk + heads
        kvs.append(KV(f"{row.arch}.nextn_predict_layers", heads, gguf.GGUFValueType.UINT32))
    kvs = [*general_kvs(f"bmoe-tiny-mtp-{head}-{row.name}-{quant}", tinymoe._FILE_TYPE[quant],
                        quant not in ("F32", "F16")), *kvs, *vocab_kvs(d.n_vocab)]
    encoded = [(name, *tinymoe._encode(name, data, quant)) for name, data in tensors]
    return tinymoe._write_gguf(Path(path), row.arch, kvs, encoded, 1)[0]


def mtp_fixture(arch: str = "glm4moe", quant: str = "Q8_0", *, head: str = "agree", seed: int = 0) -> Path:
    """A cached MTP fixture (generated on first use) beside tinymoe's."""
    _check(arch, quant, head)
    h = hashlib.sha256(tinymoe.generator_version().encode())
    h.update(Path(__file__).read_bytes())
    h.update(Path(assistant_rows.__file__).read_bytes())
    cache = tinymoe.fixtures_dir()
    final = cache / f"tiny-mtp-{head}-{arch}-{quant}-seed{seed}-{h.hexdigest()[:12]}.gguf"
    if final.is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=".gen-", dir=cache))
    try:
        if arch in MTP_HEADS:
            os.replace(write_mtp_moe(tmpdir / final.name, arch, quant, head=head, seed=seed), final)
        else:  # the assistant first: a target without its draft model is not a fixture
            target, assistant = assistant_rows.write_target_and_assistant(tmpdir / final.name, arch, quant,
                                                                          head=head, seed=seed)
            os.replace(assistant, draft_model_of(final))
            os.replace(target, final)
    finally:
        for p in tmpdir.iterdir():
            p.unlink()
        tmpdir.rmdir()
    return final
