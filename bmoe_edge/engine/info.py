"""`bmoe-edge info` and `--version`: what a model is and what this build carries."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bmoe_edge import __version__
from bmoe_edge.engine import native


@dataclass(frozen=True)
class VersionInfo:
    version: str
    llama_pin: str
    llama_commit: str
    hook: bool


@dataclass(frozen=True)
class ModelSummary:
    path: str
    architecture: str
    name: str
    n_layer: int
    n_embd: int
    n_expert: int
    n_expert_used: int
    n_tensors: int
    n_vocab: int
    file_bytes: int
    expert_bytes: int   # every routed-expert byte of the file (the C++ ModelInfo field, same name)

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0


def version_info() -> VersionInfo:
    build = native.load().build_info()
    return VersionInfo(__version__, build.llama_pin, build.llama_commit, build.expert_ready_hook)


def recipes() -> list:
    """The engine's recipe table (bmoe_edge._native.Recipe rows)."""
    return list(native.load().recipes())


def quantize(src: Path, dest: Path, ftype: str, threads: int = 0) -> None:
    """llama.cpp's own quantizer (K-quant fixtures are made with it)."""
    with native.engine_errors():
        native.load().quantize_model(str(src), str(dest), ftype, threads)


@dataclass(frozen=True)
class ExpertTensor:
    """A routed-expert tensor and where its bytes are (the engine's own gguf map and recipe table)."""

    name: str
    layer: int
    projection: int   # index of its suffix in the recipe row
    file: int         # shard index
    offset: int       # absolute file offset of expert 0
    bytes: int        # all experts of the tensor


def expert_tensors(path: Path) -> list[ExpertTensor]:
    """The expert tensors of a model, by layer then projection, as the engine streams them."""
    with native.engine_errors():
        found = native.load().expert_tensors(str(path))
    return [ExpertTensor(t.name, t.layer, t.projection, t.file, t.offset, t.bytes) for t in found]


def model_metadata(path: Path) -> dict[str, object]:
    """The scalar metadata keys of a gguf (numbers as float/int, strings as str); arrays left out."""
    with native.engine_errors():
        entries = native.load().model_metadata(str(path))
    out: dict[str, object] = {}
    for e in entries:
        if e.is_number:
            out[e.key] = int(e.number) if float(e.number).is_integer() else e.number
        else:
            out[e.key] = e.text
    return out


def model_summary(path: Path) -> ModelSummary:
    with native.engine_errors():
        info = native.load().probe_model(str(path))
    return ModelSummary(
        path=info.path,
        architecture=info.architecture,
        name=info.name,
        n_layer=info.n_layer,
        n_embd=info.n_embd,
        n_expert=info.n_expert,
        n_expert_used=info.n_expert_used,
        n_tensors=info.n_tensors,
        n_vocab=info.n_vocab,
        file_bytes=info.file_bytes,
        expert_bytes=info.expert_bytes,
    )
