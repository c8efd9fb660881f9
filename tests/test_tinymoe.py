"""Tiny synthetic MoE fixtures: every row writes a gguf llama.cpp's loader accepts, with the right experts."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from bmoe_edge.errors import BmoeError
from bmoe_edge.synthetic import tinymoe

from conftest import run_cli

GT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType


needs_native = pytest.mark.usefixtures("native")  # conftest: fails, never skips, without the build


# Parsing the full 32000-token vocabulary costs GGUFReader ~0.8 s per file: the structural matrix
# uses the first SMALL_VOCAB tokens (still a valid SPM vocabulary), the rest the real fixtures.
SMALL_VOCAB = 512


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    """Write each (arch, quant, vocab) once per module; returns a function -> path."""
    root = tmp_path_factory.mktemp("tiny")
    done: dict[tuple[str, str, int | None], Path] = {}

    def get(arch: str, quant: str, vocab_size: int | None = None) -> Path:
        key = (arch, quant, vocab_size)
        if key not in done:
            path = root / f"{arch}-{quant}-{vocab_size or 'full'}.gguf"
            assert tinymoe.write_tiny_moe(path, arch, quant, vocab_size=vocab_size) == [path]
            done[key] = path
        return done[key]

    return get


def field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


@pytest.mark.parametrize("quant", tinymoe.DIRECT_QUANTS)
@pytest.mark.parametrize("arch", tinymoe.ARCHS)
def test_fixture_has_the_rows_tensors_and_keys(written, arch: str, quant: str) -> None:
    row = tinymoe.ROWS[arch]
    d = tinymoe.dims_for(arch, quant)
    reader = gguf.GGUFReader(written(arch, quant, SMALL_VOCAB))
    prefix = row.arch
    assert field(reader, "general.architecture") == row.arch
    assert field(reader, f"{prefix}.block_count") == d.n_layer_all  # the trunk's 4 and any MTP layers
    assert field(reader, f"{prefix}.embedding_length") == d.n_embd
    if row.is_moe:
        assert field(reader, f"{prefix}.expert_count") == 8
        assert field(reader, f"{prefix}.expert_used_count") == 2
    else:
        assert f"{prefix}.expert_count" not in reader.fields

    tensors = {t.name: t for t in reader.tensors}
    expected = {"token_embd.weight", "output.weight"} | ({row.output_norm} if row.output_norm else set())
    expected |= {t.name for t in row.model}
    expected |= {f"blk.{il}.{t.name}" for il in range(d.n_layer_all) for t in row.layer if t.in_layer(il, d)}
    assert set(tensors) == expected

    wanted = GT[quant]
    experts = tinymoe.expert_tensors(arch)
    by_suffix = {t.name.removesuffix(".weight"): t for t in row.layer}
    moe_layers = [il for il in range(d.n_layer_all) if row.is_moe and by_suffix[row.experts[-1]].in_layer(il, d)]
    assert len(experts) == len(row.experts) * len(moe_layers)
    assert len(moe_layers) >= (2 if row.is_moe else 0)
    for name in experts:
        t = tensors[name]
        spec = by_suffix[name.split(".")[2]]
        ne = tuple(d.value(s) for s in spec.ne)
        assert tuple(int(x) for x in t.shape) == ne, name
        assert ne[2] == 8
        assert t.tensor_type == wanted, name
        block, type_size = gguf.GGML_QUANT_SIZES[wanted]
        assert t.n_bytes == ne[0] * ne[1] * ne[2] // block * type_size
    # norms, router, biases and sinks stay F32; the big matrices carry the quant type
    for name, t in tensors.items():
        if name.endswith(("_norm.weight", "norm_1.weight", "norm_2.weight", ".bias", "ffn_gate_inp.weight",
                          "attn_sinks.weight", ".scale", "rope_freqs.weight", "ffn_gate_inp_shexp.weight")):
            assert t.tensor_type == GT.F32, name
    assert tensors["token_embd.weight"].tensor_type == wanted
    assert tensors["output.weight"].tensor_type == wanted
    assert [int(x) for x in tensors["output.weight"].shape] == [d.n_embd, SMALL_VOCAB]
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == SMALL_VOCAB


def test_tokenizer_keys_are_copied_with_their_types(written) -> None:
    vocab = gguf.GGUFReader(tinymoe.vocab_path())
    model = gguf.GGUFReader(written("qwen3moe", "Q4_0"))
    keys = [k for k in vocab.fields if k.startswith("tokenizer.")]
    assert "tokenizer.ggml.tokens" in keys and len(keys) >= 8
    for key in keys:
        assert model.fields[key].types == vocab.fields[key].types, key
        assert model.fields[key].contents() == vocab.fields[key].contents(), key
    assert len(model.fields["tokenizer.ggml.tokens"].data) == 32000


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = tinymoe.write_tiny_moe(tmp_path / "a.gguf", "olmoe", "Q4_0", seed=1, vocab_size=SMALL_VOCAB)[0]
    b = tinymoe.write_tiny_moe(tmp_path / "b.gguf", "olmoe", "Q4_0", seed=1, vocab_size=SMALL_VOCAB)[0]
    c = tinymoe.write_tiny_moe(tmp_path / "c.gguf", "olmoe", "Q4_0", seed=2, vocab_size=SMALL_VOCAB)[0]
    assert a.read_bytes() == b.read_bytes()
    assert a.stat().st_size == c.stat().st_size and a.read_bytes() != c.read_bytes()


def test_expert_slices_span_pages_and_share_pages(written) -> None:
    """Page logic needs both: slices of several KiB, and a config where several slices share a 4 KiB page."""

    def slice_bytes(arch: str, quant: str) -> int:
        reader = gguf.GGUFReader(written(arch, quant, SMALL_VOCAB))
        t = next(t for t in reader.tensors if t.name == tinymoe.expert_tensors(arch)[0])
        return int(t.n_bytes) // 8

    assert slice_bytes("qwen3moe", "Q4_0") > 4096
    assert slice_bytes("qwen3moe", "F32") >= 8 * 4096
    assert slice_bytes("olmoe", "Q4_0") <= 2048  # 1152 bytes: three or four slices per page


def test_split_shards_have_the_gguf_split_keys(tmp_path: Path, written) -> None:
    paths = tinymoe.write_tiny_moe(tmp_path / "m.gguf", "gpt-oss", "Q8_0", split=3, vocab_size=SMALL_VOCAB)
    assert [p.name for p in paths] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert not (tmp_path / "m.gguf").exists()
    single = {t.name for t in gguf.GGUFReader(written("gpt-oss", "Q8_0", SMALL_VOCAB)).tensors}
    seen: list[str] = []
    for i, path in enumerate(paths):
        reader = gguf.GGUFReader(path)
        assert field(reader, "split.no") == i
        assert reader.fields["split.no"].types == [VT.UINT16]
        assert field(reader, "split.count") == 3
        assert reader.fields["split.count"].types == [VT.UINT16]
        assert field(reader, "split.tensors.count") == len(single)
        assert reader.fields["split.tensors.count"].types == [VT.INT32]
        names = [t.name for t in reader.tensors]
        assert names, path
        seen += names
        other_keys = {k for k in reader.fields if not k.startswith(("GGUF.", "split."))}
        if i == 0:
            assert "general.architecture" in other_keys and "tokenizer.ggml.tokens" in other_keys
        else:
            assert other_keys == set()
    assert sorted(seen) == sorted(single)
    # the experts are spread over more than one shard
    experts = set(tinymoe.expert_tensors("gpt-oss"))
    shards_with_experts = [p for p in paths if experts & {t.name for t in gguf.GGUFReader(p).tensors}]
    assert len(shards_with_experts) >= 2


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"arch": "mixtral9000", "quant": "Q4_0"}, "known: qwen3moe, qwen2moe, olmoe"),
        ({"arch": "olmoe", "quant": "Q3_K"}, "known: F32, F16, Q8_0, Q4_0, MXFP4, Q4_K_M"),
        ({"arch": "olmoe", "quant": "Q4_0", "split": 0}, "split"),
        ({"arch": "olmoe", "quant": "Q4_0", "split": 10_000}, "cannot split"),
        ({"arch": "olmoe", "quant": "Q4_0", "n_embd": 48}, "multiple of 32"),
        ({"arch": "olmoe", "quant": "Q4_0", "vocab_size": 10}, "vocab_size"),
    ],
)
def test_bad_arguments_raise_bmoe_error(tmp_path: Path, kwargs: dict, needle: str) -> None:
    with pytest.raises(BmoeError, match=needle):
        tinymoe.write_tiny_moe(tmp_path / "x.gguf", **kwargs)


def test_unknown_arch_or_quant_in_fixture_raise() -> None:
    with pytest.raises(BmoeError, match="unknown tiny-model architecture"):
        tinymoe.fixture("nope", "Q4_0")
    with pytest.raises(BmoeError, match="unknown tiny-model quant"):
        tinymoe.fixture("olmoe", "nope")


def test_fixture_cache_generates_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BMOE_EDGE_CACHE", str(tmp_path / "cache"))
    first = tinymoe.fixture("olmoe", "Q8_0", seed=5, split=2)
    assert first.parent == tmp_path / "cache" / "fixtures"
    assert first.name.endswith("-00001-of-00002.gguf")
    assert "olmoe" in first.name and "Q8_0" in first.name and "seed5" in first.name
    assert tinymoe.generator_version() in first.name
    shards = tinymoe.shard_paths(first, 2)  # the first shard's path works as well as the base name
    assert shards[0] == first and shards[1].name == first.name.replace("-00001-of-", "-00002-of-")
    assert all(p.is_file() for p in shards)
    mtime = first.stat().st_mtime_ns
    assert tinymoe.fixture("olmoe", "Q8_0", seed=5, split=2) == first
    assert first.stat().st_mtime_ns == mtime
    files = sorted(p.name for p in (tmp_path / "cache" / "fixtures").iterdir())
    assert len(files) == 2 and not any(f.startswith(".") for f in files)  # no temp leftovers


def test_cli_writes_and_prints_the_paths(tmp_path: Path) -> None:
    result = run_cli("tiny-model", "--arch", "qwen2moe", "--quant", "Q4_0", "-o", str(tmp_path / "t.gguf"),
                     "--split", "2", "--seed", "7")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(tmp_path / f"t-0000{i}-of-00002.gguf") for i in (1, 2)]
    bad = run_cli("tiny-model", "--arch", "nope", "--quant", "Q4_0", "-o", str(tmp_path / "u.gguf"))
    assert bad.returncode == 1 and "error: unknown tiny-model architecture" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("arch", tinymoe.ARCHS)
def test_llama_cpp_reads_arch_and_experts(native, written, arch: str) -> None:
    info = native.probe_model(str(written(arch, "Q8_0")))
    row = tinymoe.ROWS[arch]
    assert info.architecture == row.arch
    n_layer_all = tinymoe.dims_for(arch, "Q8_0").n_layer_all  # block_count: the trunk's 4 and any MTP layers
    assert (info.n_layer, info.n_embd, info.n_vocab) == (n_layer_all, 64, 32000)
    assert (info.n_expert, info.n_expert_used) == ((8, 2) if row.is_moe else (0, 0))


@needs_native
def test_info_command_shows_the_experts(written) -> None:
    result = run_cli("info", str(written("qwen3moe", "Q4_0")), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["architecture"] == "qwen3moe"
    assert (summary["n_layer"], summary["n_expert"], summary["n_expert_used"]) == (4, 8, 2)


def test_k_quant_made_by_llama_cpp_split_in_two(native, tmp_path: Path) -> None:
    paths = tinymoe.write_tiny_moe(tmp_path / "k.gguf", "gemma4", "Q4_K_M", split=2)
    assert len(paths) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)  # temp files removed
    types = {}
    for p in paths:
        types |= {t.name: t.tensor_type for t in gguf.GGUFReader(p).tensors}
    experts = tinymoe.expert_tensors("gemma4")
    assert {types[n] for n in experts} <= {GT.Q4_K, GT.Q5_K, GT.Q6_K}
    assert GT.Q4_K in {types[n] for n in experts}
    assert types["blk.0.ffn_gate_inp.weight"] == GT.F32
    info = native.probe_model(str(paths[0]))
    assert (info.architecture, info.n_expert, info.n_expert_used) == ("gemma4", 8, 2)
