"""`bmoe-edge info` and `--version`: what a model is and what this build carries."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bmoe_edge import __version__, native


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
    expert_bytes: int

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0


def version_info() -> VersionInfo:
    build = native.load().build_info()
    return VersionInfo(__version__, build.llama_pin, build.llama_commit, build.expert_ready_hook)


def recipes() -> list:
    """The engine's recipe table (bmoe_edge._native.Recipe rows)."""
    return list(native.load().recipes())


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
