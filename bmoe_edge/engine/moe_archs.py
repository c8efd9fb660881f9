"""Every MoE architecture of the pinned llama.cpp, derived from its sources, and each one's status.

An architecture is MoE-capable when the graph llama.cpp builds for it calls `build_moe_ffn`:
`llama-model.cpp`'s `llama_model_mapping` gives the model class of each `LLM_ARCH_*`, `models.h` the
graph a class borrows (`using graph = llama_model_<other>::graph`), `models/*.cpp` the graphs that
call `build_moe_ffn`, and `llama-arch.cpp` the gguf name of each `LLM_ARCH_*`. The result is kept in
`PINNED` (a board has no llama.cpp sources); `python -m bmoe_edge.engine.moe_archs` prints it again
from the sources and a test checks the two agree.

Status: "gated" (a tiny fixture passes streamed == resident in the gates), "refused" (the engine's
recipe row says why its experts cannot be streamed), else "untested" (the default discovery applies:
it may well stream, but no gate has proven it).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge import llama_source

# (gguf architecture, the llama.cpp source file of its graph): derived, not hand-edited.
PINNED: tuple[tuple[str, str], ...] = (
    ('llama', 'llama.cpp'),
    ('llama4', 'llama4.cpp'),
    ('llama-embed', 'llama.cpp'),
    ('grok', 'grok.cpp'),
    ('bert', 'bert.cpp'),
    ('jina-bert-v2', 'bert.cpp'),
    ('jina-bert-v3', 'bert.cpp'),
    ('nomic-bert', 'bert.cpp'),
    ('nomic-bert-moe', 'bert.cpp'),
    ('mellum', 'mellum.cpp'),
    ('llada-moe', 'llada-moe.cpp'),
    ('rnd1', 'rnd1.cpp'),
    ('qwen2moe', 'qwen2moe.cpp'),
    ('qwen3moe', 'qwen3moe.cpp'),
    ('qwen3vlmoe', 'qwen3vlmoe.cpp'),
    ('phi3', 'phi3.cpp'),
    ('phimoe', 'phi3.cpp'),
    ('gemma4', 'gemma4.cpp'),
    ('maple', 'maple.cpp'),
    ('jamba', 'jamba.cpp'),
    ('cohere2moe', 'cohere2moe.cpp'),
    ('dbrx', 'dbrx.cpp'),
    ('olmoe', 'olmoe.cpp'),
    ('arctic', 'arctic.cpp'),
    ('deepseek', 'deepseek.cpp'),
    ('deepseek2', 'deepseek2.cpp'),
    ('deepseek2-ocr', 'deepseek2.cpp'),
    ('deepseek32', 'deepseek32.cpp'),
    ('dots3note', 'dots3note.cpp'),
    ('deepseek4', 'deepseek4.cpp'),
    ('glm-dsa', 'glm-dsa.cpp'),
    ('mistral4', 'deepseek2.cpp'),
    ('glm4moe', 'glm4-moe.cpp'),
    ('nemotron_h', 'nemotron-h.cpp'),
    ('nemotron_h_moe', 'nemotron-h.cpp'),
    ('exaone-moe', 'exaone-moe.cpp'),
    ('granite', 'granite.cpp'),
    ('granitemoe', 'granite.cpp'),
    ('minicpm', 'granite.cpp'),
    ('granitehybrid', 'granite-hybrid.cpp'),
    ('granite_swa', 'granite-swa.cpp'),
    ('bailingmoe', 'bailingmoe.cpp'),
    ('bailingmoe2', 'bailingmoe2.cpp'),
    ('bailingmoe3', 'bailingmoe3.cpp'),
    ('dots1', 'dots1.cpp'),
    ('afmoe', 'afmoe.cpp'),
    ('laguna', 'laguna.cpp'),
    ('ernie4_5-moe', 'ernie4-5-moe.cpp'),
    ('hunyuan-moe', 'hunyuan-moe.cpp'),
    ('hy_v3', 'hy-v3.cpp'),
    ('hy_v4', 'hy-v4.cpp'),
    ('gpt-oss', 'openai-moe.cpp'),
    ('lfm2', 'lfm2.cpp'),
    ('lfm2moe', 'lfm2.cpp'),
    ('smallthinker', 'smallthinker.cpp'),
    ('grovemoe', 'grovemoe.cpp'),
    ('minimax-01', 'minimax-01.cpp'),
    ('minimax-m2', 'minimax-m2.cpp'),
    ('minimax-m3', 'minimax-m3.cpp'),
    ('qwen3next', 'qwen3next.cpp'),
    ('qwen35moe', 'qwen35moe.cpp'),
    ('qwen4exp', 'qwen4exp.cpp'),
    ('mistral3', 'mistral3.cpp'),
    ('dflash', 'dflash.cpp'),
    ('mimo2', 'mimo2.cpp'),
    ('kimi-linear', 'kimi-linear.cpp'),
    ('kimi-k3', 'kimi-k3.cpp'),
    ('glm5-next', 'glm5-next.cpp'),
    ('step35', 'step35.cpp'),
)


def derive(llama_src: Path) -> list[tuple[str, str]]:
    """(architecture, graph source file) for each MoE-capable architecture, in llama_model_mapping order."""
    src = llama_src / "src"
    models = src / "models"
    header = (models / "models.h").read_text()
    borrowed = {}
    for m in re.finditer(r"struct (llama_model_\w+)\s*:[^{]*\{(.*?)\n\};", header, re.S):
        alias = re.search(r"using graph\s*=\s*(llama_model_\w+)::graph", m.group(2))
        if alias:
            borrowed[m.group(1)] = alias.group(1)
    moe_graphs = {}
    for path in sorted(models.glob("*.cpp")):
        text = path.read_text()
        if "build_moe_ffn" in text:
            for cls in re.findall(r"(llama_model_\w+)::graph(?:<\w+>)?::graph\s*\(", text):
                moe_graphs[cls] = path.name
    model_cpp = (src / "llama-model.cpp").read_text()
    mapping = model_cpp[model_cpp.index("llama_model_mapping("):]
    mapping = mapping[: mapping.index("\n}\n")]
    names = dict(re.findall(r"\{\s*(LLM_ARCH_\w+),\s*\"([^\"]+)\"\s*\}", (src / "llama-arch.cpp").read_text()))
    out = []
    for enum, cls in re.findall(r"case (LLM_ARCH_\w+):\s*return new (llama_model_\w+)\(", mapping):
        graph = borrowed.get(cls, cls)
        if graph in moe_graphs:
            out.append((names[enum], moe_graphs[graph]))
    return out


@dataclass(frozen=True)
class ArchStatus:
    architecture: str
    status: str  # gated | refused | untested
    source: str  # llama.cpp's src/models/<file> with the graph
    reason: str = ""  # why it is refused
    fixture: str = ""  # the gate fixture row(s) that cover it
    note: str = ""
    draft_model: str = ""  # the architecture of its separate draft model (--draft-model), if it has one


def statuses(gated: dict[str, str], recipes: list) -> list[ArchStatus]:
    """Each pinned MoE architecture with its status; `gated` maps architecture -> fixture row names,
    `recipes` are the engine's rows (refusals and notes)."""
    rows = {r.architecture: r for r in recipes}
    out = []
    for arch, file in PINNED:
        source = f"src/models/{file}"
        row = rows.get(arch)
        refused = row.refused if row is not None else ""
        extra = {"note": row.note, "draft_model": row.draft_model} if row is not None else {}
        if refused:
            out.append(ArchStatus(arch, "refused", source, reason=refused, **extra))
        elif arch in gated:
            out.append(ArchStatus(arch, "gated", source, fixture=gated[arch], **extra))
        else:
            out.append(ArchStatus(arch, "untested", source, **extra))
    return out


def unproven_note(architecture: str, gated: dict[str, str], recipes: list) -> str:
    """A one-line warning for streaming an architecture no gate has proven ("" when gated, refused
    or not a pinned MoE architecture)."""
    for row in statuses(gated, recipes):
        if row.architecture == architecture and row.status == "untested":
            return (f"architecture '{architecture}' streams through the default expert discovery, but no gate "
                    "has proven it bit-exact yet (bmoe-edge archs); --no-stream runs it resident")
    return ""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    src = Path(args[0]) if args else llama_source.default_dest(True)
    for arch, source in derive(src):
        print(f"    ({arch!r}, {source!r}),")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
