"""Where a model's expert bytes are, as the engine sees them: its gguf map and recipe table through the
bindings (bmoe_edge.engine.info), not a second gguf reader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmoe_edge.engine import info
from bmoe_edge.errors import BmoeError


@dataclass(frozen=True)
class ExpertSlices:
    """One routed-expert tensor as the engine reads it: n_expert slices of slice_bytes from offset
    (engine.info.ExpertTensor is the same tensor with `bytes` = all its experts, as the C++ side has it)."""

    name: str
    layer: int
    projection: int
    offset: int  # absolute file offset of expert 0
    slice_bytes: int  # one expert of this projection: a slice the engine reads
    n_expert: int


@dataclass
class GgufLayout:
    path: Path
    file_bytes: int
    metadata: dict[str, Any]
    experts: list[ExpertSlices]

    @property
    def n_expert(self) -> int:
        return self.experts[0].n_expert if self.experts else 0

    @property
    def n_expert_used(self) -> int:
        arch = self.metadata.get("general.architecture", "")
        return int(self.metadata.get(f"{arch}.expert_used_count", 0))

    def layers(self) -> dict[int, list[ExpertSlices]]:
        out: dict[int, list[ExpertSlices]] = {}
        for t in self.experts:
            out.setdefault(t.layer, []).append(t)
        return {k: sorted(v, key=lambda t: t.projection) for k, v in sorted(out.items())}

    def bytes_per_expert(self, layer: int) -> int:
        return sum(t.slice_bytes for t in self.layers()[layer])

    @property
    def all_expert_bytes(self) -> int:
        """Every routed-expert byte of the file (what engine.info's ModelSummary.expert_bytes counts)."""
        return sum(t.slice_bytes * t.n_expert for t in self.experts)

    @property
    def routed_bytes_per_token(self) -> int:
        return sum(t.slice_bytes for t in self.experts) * self.n_expert_used

    def locate(self, offset: int) -> tuple[ExpertSlices, int] | None:
        for t in self.experts:
            if t.offset <= offset < t.offset + t.slice_bytes * t.n_expert:
                return t, (offset - t.offset) // t.slice_bytes
        return None


def gguf_layout(path: Path) -> GgufLayout:
    """Metadata scalars and the expert tensors' file offsets of a single-file gguf."""
    path = Path(path)
    metadata = info.model_metadata(path)
    if int(metadata.get("split.count", 1) or 1) > 1:  # type: ignore[call-overload]
        raise BmoeError(f"{path}: split models are not supported by the benchmark (merge the shards)")
    arch = metadata.get("general.architecture", "")
    n_expert = int(metadata.get(f"{arch}.expert_count", 0) or 0)  # type: ignore[call-overload]
    experts = [ExpertSlices(t.name, t.layer, t.projection, t.offset, t.bytes // n_expert, n_expert)
               for t in info.expert_tensors(path)] if n_expert else []
    return GgufLayout(path, path.stat().st_size, metadata, experts)
