"""Every MoE architecture of the pinned llama.cpp is accounted for: gated by a passing cell, refused with
a reason said before any weight loads, or listed as untested; and every weight type ships through."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import gguf
import pytest

from bmoe_edge.engine import info as engine_info
from bmoe_edge.engine import moe_archs
from bmoe_edge.proof import gates
from bmoe_edge.synthetic import release_types, tinymoe

from conftest import LLAMA_SRC, assert_clean_error, run_cli

# The architectures issue 16 names: each must be gated.
NAMED = ("qwen35moe", "qwen3next", "lfm2moe", "smallthinker", "glm4moe", "ernie4_5-moe", "granitehybrid",
         "hunyuan-moe", "dots1", "bailingmoe2", "llama4", "minimax-m2", "nemotron_h_moe", "exaone-moe",
         "deepseek2", "bailingmoe")


def test_the_pinned_list_is_what_llama_cpp_s_sources_say() -> None:
    assert moe_archs.derive(LLAMA_SRC) == list(moe_archs.PINNED)


def test_archs_lists_every_moe_architecture_with_a_status() -> None:
    result = run_cli("archs", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    rows = {r["architecture"]: r for r in report["architectures"]}
    assert list(rows) == [arch for arch, _ in moe_archs.PINNED]
    assert report["counts"]["gated"] >= 24
    assert {arch for arch in NAMED if rows[arch]["status"] != "gated"} == set()
    for r in rows.values():
        assert r["status"] in ("gated", "refused", "untested")
        assert bool(r["reason"]) == (r["status"] == "refused"), r
        assert bool(r["fixture"]) == (r["status"] == "gated"), r
    # every fixture row is an architecture of the pinned llama.cpp, and gated
    assert {tinymoe.ROWS[name].arch for name in tinymoe.MOE_ARCHS} <= {a for a, r in rows.items()
                                                                       if r["status"] == "gated"}
    text = run_cli("archs")
    assert text.returncode == 0 and text.stdout.splitlines()[-1].startswith(f"archs: {len(rows)} MoE architectures")


def test_every_gated_architecture_streams_bit_identically() -> None:
    """The arch column of the matrix (every fixture row, Q8_0, small cache): ids and logits."""
    cells = [c for c in gates.breadth_matrix() if c.fixture.quant == gates.ARCH_COLUMN_QUANT]
    assert {c.fixture.arch for c in cells} == set(tinymoe.MOE_ARCHS)
    results = list(gates.run_gates(cells, gates.fixture_resolver(None), steps=6))
    failed = [r for r in results if not r.passed]
    assert not failed, failed[:3]


@pytest.mark.parametrize("quant", gates.TYPE_COLUMN_QUANTS)
def test_every_weight_type_streams_bit_identically(quant: str) -> None:
    """The type column: llama.cpp's quantizer makes the experts, on split and fused gate/up layouts."""
    cells = [c for c in gates.breadth_matrix() if c.fixture.quant == quant]
    assert {c.fixture.arch for c in cells} == set(gates.TYPE_COLUMN_ARCHS)
    for c in cells:  # split and fused gate/up alike (gemma4's MIXED was once Q8_0 there: a regex missed it)
        assert_experts_sized_as(c.fixture)
    results = list(gates.run_gates(cells, gates.fixture_resolver(None), steps=6))
    assert all(r.passed for r in results), results


@pytest.mark.parametrize("quant,types", [
    ("MXFP4_MOE", {"ffn_gate_exps": "MXFP4", "ffn_up_exps": "MXFP4", "ffn_down_exps": "MXFP4"}),
    ("MIXED", {"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q4_K", "ffn_down_exps": "Q6_K", "attn_q": "Q8_0"}),
    ("IQ4_XS", {"ffn_gate_exps": "IQ4_XS", "ffn_up_exps": "IQ4_XS"}),
])
def test_the_quantizer_made_the_types_it_names(quant: str, types: dict[str, str]) -> None:
    reader = gguf.GGUFReader(tinymoe.fixture("qwen3moe", quant))
    got = {t.name.split(".")[2]: t.tensor_type.name for t in reader.tensors if t.name.startswith("blk.1.")}
    assert {k: got[k] for k in types} == types


# What a fixture type's routed gate/up experts must be (llama.cpp's recipes mix in other types elsewhere).
EXPERT_TYPE = {"Q8_0": "Q8_0", "Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K", "Q3_K_M": "Q3_K", "Q2_K": "Q2_K",
               "IQ4_XS": "IQ4_XS", "MXFP4": "MXFP4", "MXFP4_MOE": "MXFP4", "MIXED": "Q4_K"}


def assert_experts_are(spec: gates.FixtureSpec) -> None:
    """The cell's fixture really is its type where it counts: every routed gate/up expert tensor, and (the
    converter's MXFP4 shape) BF16 for the other matrices."""
    reader = gguf.GGUFReader(gates.fixture_resolver(None)(spec))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    experts = [n for n in tinymoe.expert_tensors(spec.arch) if "_down_" not in n]
    assert experts and {types[n] for n in experts} == {EXPERT_TYPE[spec.quant]}, (spec, {n: types[n] for n in experts})
    if spec.quant == "MXFP4":
        assert types["output.weight"] == "BF16"


def assert_experts_sized_as(spec: gates.FixtureSpec) -> None:
    """The cheap form (parsing a fixture's 32000-token vocabulary with GGUFReader takes seconds): every routed
    gate/up expert tensor the engine maps has its type's size (a fallback type, Q5_0 for Q4_K or BF16 for
    MXFP4, has another)."""
    d, row = tinymoe.dims_for(spec.arch, spec.quant), tinymoe.ROWS[spec.arch]
    by_suffix = {t.name.removesuffix(".weight"): t for t in row.layer}
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[EXPERT_TYPE[spec.quant]]]
    experts = [t for t in engine_info.expert_tensors(gates.fixture_resolver(None)(spec)) if "_down_" not in t.name]
    assert experts
    for t in experts:
        ne = [d.value(s) for s in by_suffix[t.name.split(".")[2]].ne]
        assert t.bytes == math.prod(ne) // block * size, (spec, t)


def test_every_row_is_gated_in_q4_k_and_in_its_releases_types() -> None:
    """One fact per row (release_types.RELEASES), derived into the gate matrix and into the docs' table."""
    assert list(release_types.RELEASES) == list(tinymoe.MOE_ARCHS)
    full = {(c.fixture.arch, c.fixture.quant) for c in gates.full_matrix()
            if c.fixture.split == 1 and not c.fixture.mtp}
    for name in tinymoe.MOE_ARCHS:
        types = release_types.row_types(name)
        assert types[:2] == ("Q8_0", "Q4_K_M") and set(types) <= set(EXPERT_TYPE), name
        assert {(name, t) for t in types} <= full, name
    for name in ("gpt-oss", "deepseek4", "kimi-k3", "mimo2"):  # their experts ship in MXFP4
        assert "MXFP4" in release_types.row_types(name)
    doc = (Path(__file__).parents[1] / "docs" / "architectures.md").read_text()
    table = doc.split("<!-- release-types:begin -->\n")[1].split("\n<!-- release-types:end -->")[0]
    assert table == release_types.markdown(), "refresh it: python -m bmoe_edge.synthetic.release_types"


def test_the_release_sample_streams_bit_identically() -> None:
    """The suite's share of the release matrix (gates.RELEASE_SAMPLE: flagships in Q4_K_M and MXFP4); the rest
    of it is `bmoe-edge gates`. Each fixture's experts are checked to be the type it names first."""
    cells = gates.release_sample()
    assert len(cells) == len(gates.RELEASE_SAMPLE) and {c.fixture.quant for c in cells} == {"Q4_K_M", "MXFP4"}
    for c in cells:
        assert_experts_sized_as(c.fixture)
    results = list(gates.run_gates(cells, gates.fixture_resolver(None), steps=6))
    failed = [gates.format_result(r) for r in results if not r.passed]
    assert not failed and len(results) == len(cells), failed


@pytest.mark.full_campaign
def test_every_release_fixture_is_the_type_it_names() -> None:
    """Every fixture of the release matrix (what `bmoe-edge gates` runs): its experts in its type."""
    for c in gates.release_matrix():
        assert_experts_are(c.fixture)
        assert_experts_sized_as(c.fixture)


def test_generate_refuses_a_refused_architecture_before_loading(tmp_path: Path) -> None:
    path = tmp_path / "encoder.gguf"
    writer = gguf.GGUFWriter(path, "nomic-bert-moe")
    writer.add_tensor("blk.0.ffn_up_exps.weight", __import__("numpy").zeros((8, 32, 32), dtype="float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = run_cli("generate", "-m", str(path), "-p", "Hi", "-n", "2", "--stream")
    assert_clean_error(result, "nomic-bert-moe", "cannot be streamed", "encoder", "--no-stream")


def test_the_full_matrix_has_the_breadth_columns_once() -> None:
    full = gates.full_matrix()
    keys = [(c.fixture, c.case.name) for c in full]
    assert len(keys) == len(set(keys))
    assert set((c.fixture, c.case.name) for c in gates.breadth_matrix()) <= set(keys)
    assert {c.fixture.arch for c in full} == set(tinymoe.MOE_ARCHS)
    assert {c.fixture.quant for c in full} >= set(gates.TYPE_COLUMN_QUANTS)


def test_streaming_an_unproven_architecture_is_said_not_silent() -> None:
    gated, recipes = gates.gated_architectures(), engine_info.recipes()
    rows = {r.architecture: r.status for r in moe_archs.statuses(gated, recipes)}
    # every architecture at the pin is gated or refused: a new one (here: one without its row) is untested
    untested = "olmoe"
    ungated = {arch: rows for arch, rows in gated.items() if arch != untested}
    note = moe_archs.unproven_note(untested, ungated, recipes)
    assert untested in note and "no gate has proven it" in note and "--no-stream" in note
    assert moe_archs.unproven_note(untested, gated, recipes) == ""  # gated
    refused = next(a for a, s in rows.items() if s == "refused")
    assert moe_archs.unproven_note(refused, gated, recipes) == ""  # refused before loading, with its reason


@pytest.mark.parametrize("arch", tinymoe.REFUSED_ROWS)
def test_every_refused_fixture_is_refused_before_loading(tmp_path: Path, arch: str) -> None:
    """The refused architectures' fixture rows (kept to measure the refusal again) stay out of the gates,
    and generate says the reason in one line before loading weights."""
    assert arch not in tinymoe.ROWS
    rows = {r.architecture: r for r in moe_archs.statuses(gates.gated_architectures(), engine_info.recipes())}
    assert rows[arch].status == "refused" and rows[arch].reason
    path = tinymoe.write_tiny_moe(tmp_path / f"{arch}.gguf", arch, "Q8_0", vocab_size=512)[0]
    result = run_cli("generate", "-m", str(path), "-p", "Hi", "-n", "2", "--stream")
    assert_clean_error(result, arch, "cannot be streamed", "--no-stream")
    assert rows[arch].reason.split(":")[0] in result.stderr


def test_the_refusals_reasons_are_what_their_fixtures_measure() -> None:
    """Diffusion decoders: the logits depend on how the prompt is batched (a causal row's do not);
    dense-only loaders: a file with experts does not load; DFlash: no context without its target."""
    import numpy as np

    from bmoe_edge.engine import Engine
    from bmoe_edge.errors import BmoeError

    def logits(arch: str, ubatch: int) -> list[bytes]:
        config = replace(gates.BASE, stream=False, batch=ubatch, ubatch=ubatch)
        with Engine(tinymoe.fixture(arch, "Q8_0"), config) as engine:
            return [b for g in gates._generate(engine, 1, 4) for b in g.logits]

    def moved(arch: str) -> float:
        return max(float(np.max(np.abs(np.frombuffer(a, np.float32) - np.frombuffer(b, np.float32))))
                   for a, b in zip(logits(arch, 64), logits(arch, 1), strict=True))

    assert moved("qwen3moe") == 0.0
    assert moved("llada-moe") > 0.1 and moved("rnd1") > 0.1
    for arch, missing in (("phi3", "ffn_down.weight' not found"), ("lfm2", "ffn_gate.weight' not found"),
                          ("dflash", "requires ctx_other")):
        with pytest.raises(BmoeError, match=missing):
            Engine(tinymoe.fixture(arch, "Q8_0"), replace(gates.BASE, stream=False)).close()


def test_mtp_blocks_are_in_the_file_and_never_routed(tmp_path: Path) -> None:
    """Fixtures whose real files carry an MTP block carry it too; llama.cpp skips it (load_mtp off), so a
    streamed generation routes the trunk's layers only (docs/architectures.md)."""
    from bmoe_edge.engine import Engine

    mtp = [name for name in tinymoe.MOE_ARCHS if tinymoe.dims_for(name, "Q8_0").n_nextn]
    assert {"deepseek4", "deepseek32", "glm-dsa", "glm5-next", "mimo2", "step35", "bailingmoe3"} <= set(mtp)
    for name in mtp:
        d = tinymoe.dims_for(name, "Q8_0")
        path = tinymoe.fixture(name, "Q8_0")
        reader = gguf.GGUFReader(path)
        assert reader.fields[f"{tinymoe.ROWS[name].arch}.nextn_predict_layers"].contents() == d.n_nextn
        assert f"blk.{d.n_layer}.nextn.eh_proj.weight" in {t.name for t in reader.tensors}
        trace = tmp_path / f"{name}.csv"
        with Engine(path, replace(gates.BASE, stream=True, route_trace=str(trace))) as engine:
            gates._generate(engine, 1, 2)
        routed = {int(line.split(",")[2]) for line in trace.read_text().splitlines()[1:]}
        with_experts = {int(t.split(".")[1]) for t in tinymoe.expert_tensors(name)}
        assert routed == {il for il in with_experts if il < d.n_layer}, name  # MTP experts (if any) never read
