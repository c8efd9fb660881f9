"""How each fixture row's real models ship: the weight types its gate cells run in, one fact per row.

Every MoE row of the table (`arch_rows.MOE_ARCHS`) is gated in the arch column's type (Q8_0), in
`KQUANT` (llama.cpp's Q4_K_M recipe: Q4_K experts, Q6_K for some down projections; what most GGUFs of
every family ship), and in the types of its real releases declared here (`RELEASES`). The gate matrix
(`proof.gates.release_matrix`) and the table in docs/architectures.md (`markdown()`, checked by
tests/test_archs.py) are derived from this table; nothing else lists them.

Where a release type cannot be written here, the nearest type that can stands in, with the reason:
NVFP4 (NVIDIA's ModelOpt checkpoints, which the pinned converter repacks) is written neither by the
`gguf` package (it only decodes it) nor by llama.cpp's quantizer (no NVFP4 file type): MXFP4 is the
nearest (the same E2M1 4-bit values; one E8M0 scale per 32 instead of an E4M3 scale per 16 and a
tensor scale). The 1-2 bit IQ types the largest models' community GGUFs come in (IQ1_S, IQ2_XXS,
IQ2_XS) need an importance matrix, which llama.cpp's quantizer refuses to go without and which a
random fixture has no meaningful one of: Q2_K (2-bit, no importance matrix needed) and IQ4_XS (the
IQ grids, non-linear) stand in.
"""

from __future__ import annotations

from dataclasses import dataclass

from bmoe_edge.synthetic.arch_rows import MOE_ARCHS

ARCH_COLUMN = "Q8_0"  # every row's breadth cell (proof.gates.ARCH_COLUMN_QUANT)
KQUANT = "Q4_K_M"  # every row, once


@dataclass(frozen=True)
class Release:
    """The types a row's real models ship in, beyond ARCH_COLUMN and KQUANT, and where that is known from."""

    types: tuple[str, ...]
    why: str


_LOW_BIT_TYPES = ("Q2_K", "IQ4_XS")
_LOW_BIT_WHY = "about 200B parameters and up: community GGUFs come in 2-4 bits to fit"


def _mxfp4(where: str, *, low_bit: bool = False) -> Release:
    why = (f"routed experts shipped in MXFP4, repacked as they are by the pinned converter ({where}); "
           "MXFP4_MOE: llama-quantize's MXFP4 experts beside Q8_0")
    if low_bit:
        return Release(("MXFP4", "MXFP4_MOE", *_LOW_BIT_TYPES), f"{why}; {_LOW_BIT_WHY}")
    return Release(("MXFP4", "MXFP4_MOE"), why)


_LOW_BIT = Release(_LOW_BIT_TYPES, _LOW_BIT_WHY)
_NVFP4 = "NVFP4 checkpoints (ModelOpt), repacked by the pinned converter ({where}): MXFP4 stands in (see above)"
_MID = Release((), "100-150B: its GGUFs ship in Q8_0 down to 2-3 bits (the 2-bit types: gated on the 200B+ rows)")
_EIGHT_BIT = Release((), "up to ~60B (or no larger release known here): its GGUFs ship in Q8_0 down to Q4_K_M")

RELEASES: dict[str, Release] = {
    "qwen3moe": Release(("Q6_K", "Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "MXFP4_MOE", "MIXED"),
                        "30B to 480B: every common GGUF type (the type column's row)"),
    "qwen2moe": _EIGHT_BIT,
    "olmoe": _EIGHT_BIT,
    "llama": _MID,
    "gpt-oss": _mxfp4("conversion/gpt_oss.py"),
    "gemma4": Release(("Q6_K", "Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "MXFP4_MOE", "MIXED"),
                      "26B: every common GGUF type (the type column's fused gate_up row)"),
    "granitemoe": _EIGHT_BIT,
    "deepseek2": _LOW_BIT,
    "mistral4": _LOW_BIT,
    "dots1": _MID,
    "ernie4_5-moe": _LOW_BIT,
    "hunyuan-moe": _MID,
    "glm4moe": _LOW_BIT,
    "bailingmoe": _LOW_BIT,
    "bailingmoe2": _MID,
    "smallthinker": _EIGHT_BIT,
    "minimax-m2": _LOW_BIT,
    "exaone-moe": _LOW_BIT,
    "llama4": _LOW_BIT,
    "qwen3vlmoe": _LOW_BIT,
    "phimoe": _EIGHT_BIT,
    "lfm2moe": _EIGHT_BIT,
    "qwen3next": _MID,
    "qwen35moe": Release(("MXFP4", *_LOW_BIT_TYPES),
                         _NVFP4.format(where="conversion/qwen.py") + f"; up to 397B: {_LOW_BIT_WHY}"),
    "granitehybrid": _EIGHT_BIT,
    "nemotron_h_moe": Release(("MXFP4",), _NVFP4.format(where="conversion/nemotron.py")),
    "nemotron_h": _EIGHT_BIT,
    "deepseek": _EIGHT_BIT,
    "dbrx": _MID,
    "arctic": _LOW_BIT,
    "cohere2moe": _EIGHT_BIT,
    "mellum": _EIGHT_BIT,
    "afmoe": _EIGHT_BIT,
    "hy_v3": _EIGHT_BIT,
    "deepseek4": _mxfp4("conversion/deepseek.py", low_bit=True),
    "deepseek32": _LOW_BIT,
    "glm-dsa": _LOW_BIT,
    "hy_v4": _EIGHT_BIT,
    "dots3note": _LOW_BIT,
    "deepseek2-ocr": _EIGHT_BIT,
    "kimi-k3": _mxfp4("conversion/kimi_k3.py", low_bit=True),
    "kimi-linear": _EIGHT_BIT,
    "glm5-next": _LOW_BIT,
    "bailingmoe3": _MID,
    "minimax-m3": _LOW_BIT,
    "minimax-01": _LOW_BIT,
    "mimo2": _mxfp4("conversion/mimo.py", low_bit=True),
    "step35": _LOW_BIT,
    "laguna": _LOW_BIT,
    "maple": _EIGHT_BIT,
    "qwen4exp": _EIGHT_BIT,
    "mistral3": _EIGHT_BIT,
    "granite": _EIGHT_BIT,
    "granite_swa": _EIGHT_BIT,
    "minicpm": _EIGHT_BIT,
    "grok": _LOW_BIT,
    "jamba": _LOW_BIT,
}


def row_types(name: str) -> tuple[str, ...]:
    """Every type a row is gated in: the arch column's, KQUANT, then its releases' (no repeats)."""
    return tuple(dict.fromkeys((ARCH_COLUMN, KQUANT, *RELEASES[name].types)))


def markdown() -> str:
    """The table docs/architectures.md carries (between its release-types markers)."""
    lines = ["| row | gated in | why these |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {', '.join(row_types(name))} | {RELEASES[name].why} |" for name in MOE_ARCHS]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
