"""The byte-identity gates: streamed output must equal resident output, token ids AND logits.

A cell is one fixture (architecture x weight type, maybe split) and one streaming configuration.
It runs the same greedy prompts through a resident engine (a plain llama.cpp run, no eval
callback) and a streamed one, with every other setting pinned equal, and compares the generated
ids and every step's raw float32 logits byte for byte. Resident results are computed once per
fixture and shared by its cells.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bmoe_edge.engine import Engine, Generation, StreamConfig, info
from bmoe_edge.engine.settings import LOSSY_SETTINGS
from bmoe_edge.errors import BmoeError
from bmoe_edge.synthetic import release_types
from bmoe_edge.synthetic.arch_rows import MOE_ARCHS, ROWS
from bmoe_edge.synthetic.specs import (  # noqa: F401 - fixture_resolver and quick_fixture_specs: the CLI's
    QUICK_FIXTURES,
    FixtureSpec,
    draft_model_for,
    fixture_resolver,
    quick_fixture_specs,
)

PROMPTS = (
    "The quick brown fox jumps over the lazy dog. Once upon a time",
    "In a small village by the sea, an old sailor said",
)
# A prompt longer than the pinned batch (64): its decode runs in several ubatches, then the compute buffers
# it wrote are given back (memory.md) and the decodes after it run in them again.
LONG_PROMPTS = (" ".join(f"Line {i}: the fox, the dog and the sailor met by the sea." for i in range(12)),)
STEPS = 24
QUICK_STEPS = 12
DRAFT_MAX = 6

# Pinned on both sides of every comparison: thread count, batch sizes, flash attention, context.
# Everything a case does not set is pinned too: serial, no read-ahead, no cache, the kernel's page unit, every
# expert on the repacked kernels where the pin has a layout (repack all: each slice converted as it is read),
# flash attention off (the default; the flash-attn-on case runs the opt-in path).
BASE = StreamConfig(threads=1, ctx=256, batch=64, ubatch=64, flash_attn=False, repack="all", overlap=False,
                    prefetch="off", cache_mb=0, page_kb=0, draft_max=DRAFT_MAX)


# The settings a case may change that change which kernels compute, and so the floats: its resident run
# uses the case's own.
KERNEL_SETTINGS = ("threads", "repack", "flash_attn")


@dataclass(frozen=True)
class StreamCase:
    """A named streaming configuration. Cache budgets are fractions of the model's expert bytes."""

    name: str
    cache: float | str = 0.0  # fraction of expert bytes, or "auto"
    overrides: dict = field(default_factory=dict)
    generations: int = 1  # >1: several generations in one engine, the cache kept between them
    echo: bool = False  # the prompts repeat the model's own continuation (speculative drafts get accepted)
    long_prompt: bool = False  # LONG_PROMPTS instead of PROMPTS
    # `repack: auto`: the kernels it must resolve to here ("all" or "dense"), and the resident run's.
    repack_resolves_to: str = ""
    # The case is there for decodes that run whole (every expert resident, no router isolated): it fails unless
    # some did.
    whole_graphs: bool = False


CASES: dict[str, StreamCase] = {c.name: c for c in (
    StreamCase("cache-off"),
    StreamCase("cache-small", cache=0.3),  # evictions in every layer of every token
    StreamCase("cache-large", cache=2.0),  # everything fits: hits after the first token
    StreamCase("cache-auto", cache="auto"),
    StreamCase("pread", overrides={"read_path": "pread"}),
    StreamCase("odirect-1-lane", cache=0.3, overrides={"io_threads": 1}),
    StreamCase("dense-anon", cache=0.3, overrides={"dense": "anon"}),
    StreamCase("two-generations", cache=0.5, generations=2),
    StreamCase("overlap-cache-off", overrides={"overlap": True}),
    StreamCase("overlap-cache-small", cache=0.3, overrides={"overlap": True}),
    StreamCase("overlap-1-lane", cache=0.3, overrides={"overlap": True, "io_threads": 1}),
    StreamCase("overlap-4-lanes-2-threads", overrides={"overlap": True, "io_threads": 4, "threads": 2}),
    StreamCase("overlap-two-generations", cache=0.5, generations=2, overrides={"overlap": True}),
    # Boards run 16 KiB (Raspberry Pi 5) and 64 KiB kernels: the mirror's shared edge units, the
    # pool's recycling and eviction at those units (valid on any kernel with smaller pages).
    StreamCase("page-16k", cache=0.3, overrides={"page_kb": 16}),
    StreamCase("page-64k-overlap", cache=0.3, overrides={"page_kb": 64, "overlap": True}),
    StreamCase("page-64k-dense-anon", cache=0.3, overrides={"page_kb": 64, "dense": "anon"}),
    # Speculative decoding verifies drafts in batched decodes: greedy output must not change.
    StreamCase("speculative-ngram", cache=0.3, echo=True, overrides={"overlap": True, "speculative": "ngram"}),
    # Read-ahead: guesses adopted while landing (overlap, nothing cached), or waited for (serial).
    StreamCase("prefetch-overlap", overrides={"overlap": True, "prefetch": "predict"}),
    StreamCase("prefetch-serial-cache-small", cache=0.3, overrides={"prefetch": "predict"}),
    StreamCase("long-prompt", cache=0.3, generations=2, long_prompt=True, overrides={"overlap": True}),
    # Every other case runs llama.cpp's repacked kernels where the pin has a layout, the experts' slices
    # converted as they are read (repack all). Here: its plain kernels on the file's bytes in place; the dense
    # weights alone repacked; and auto, which repacks the experts only where the cache holds them all.
    StreamCase("repack-off", cache=0.3, overrides={"overlap": True, "repack": "off"}),
    StreamCase("repack-dense", cache=0.3, overrides={"overlap": True, "repack": "dense"}),
    StreamCase("repack-auto-cache-small", cache=0.3, overrides={"repack": "auto"}, repack_resolves_to="dense"),
    StreamCase("repack-auto-cache-large", cache=2.0, overrides={"repack": "auto"}, repack_resolves_to="all"),
    # Flash attention (opt-in, --flash-attn on|auto: a different attention kernel, and llama.cpp's only way to run
    # minimax-m3's MSA sparse attention), against a resident run with it too.
    StreamCase("flash-attn-on", cache=0.3, overrides={"overlap": True, "flash_attn": True}),
    # Once every expert is in (the long prompt routes to nearly all of them), decodes run as one graph: the hook
    # only notes the experts used (Streaming::begin_graph).
    StreamCase("whole-graph", cache=2.0, generations=2, long_prompt=True, overrides={"overlap": True},
               whole_graphs=True),
    StreamCase("whole-graph-2-threads", cache=2.0, long_prompt=True, overrides={"overlap": True, "threads": 2},
               whole_graphs=True),
)}


# The model's own MTP head drafts (`--speculative mtp`; auto picks it where the model has one), on the
# MTP fixtures (glm4moe: attention; qwen35moe: a hybrid trunk, its recurrent state rolled back from
# snapshots; step35: three chained heads, head i drafting step i; gemma4: a separate assistant model over
# the target's KV cache, `--draft-model`, resident): a head that agrees with the model
# (drafts accepted), a noisy one (accepted and rejected, often in one step) and a random one
# (rejected: the draft policy backs off).
MTP_CASES: dict[str, StreamCase] = {c.name: c for c in (
    StreamCase("speculative-mtp", cache=0.3, overrides={"overlap": True, "speculative": "mtp"}),
    StreamCase("speculative-mtp-serial", overrides={"speculative": "mtp"}),
    StreamCase("speculative-auto-prefetch", cache=0.3,
               overrides={"overlap": True, "speculative": "auto", "prefetch": "predict"}),
)}
MTP_FIXTURES = tuple(FixtureSpec(arch, "Q8_0", mtp=head) for arch in ("glm4moe", "qwen35moe", "step35", "gemma4")
                     for head in ("agree", "noisy", "random"))


@dataclass(frozen=True)
class GateCell:
    """One fixture under one streaming configuration."""

    fixture: FixtureSpec
    case: StreamCase


@dataclass
class CellResult:
    arch: str
    quant: str
    split: int
    config: str
    passed: bool
    equal_tokens: bool = False
    equal_logits: bool = False
    steps: int = 0
    first_difference: int | None = None  # first step whose ids or logits differ
    bytes_read: int = 0
    hit_pct: float = 0.0
    read_path: str = ""
    drafted: int = 0   # speculative cells: draft tokens verified, and those the model agreed with
    accepted: int = 0
    repack_layouts: str = ""  # the layout each streamed type computed in ("q4_K: q4_K_8x8, q6_K: file")
    flash_attn: bool = False  # as llama.cpp resolved it (an architecture may refuse it)
    whole_graphs: int = 0  # decode calls computed in one piece (every expert resident)
    error: str = ""


ARCHS_WITH_FIXTURES = MOE_ARCHS  # every MoE row of the fixture table is gated

# Every configuration over these architectures and weight types (the depth of the matrix).
CONFIG_ARCHS = ("qwen3moe", "qwen2moe", "olmoe", "llama", "gpt-oss", "gemma4", "granitemoe", "deepseek2")
QUANTS = ("F32", "F16", "Q8_0", "Q4_0", "Q4_K_M")
QUICK_CASES = ("cache-off", "cache-small", "dense-anon", "overlap-cache-small", "page-16k")
# The breadth: every fixture row (ARCHS_WITH_FIXTURES, from the row table) in one type, and every weight
# type real MoE ggufs ship in on two architectures (split gate/up/down and fused gate_up), one config each.
ARCH_COLUMN_QUANT = release_types.ARCH_COLUMN
TYPE_COLUMN_ARCHS = ("qwen3moe", "gemma4")
TYPE_COLUMN_QUANTS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K", "IQ4_XS", "MXFP4_MOE", "MIXED")
COLUMN_CASE = "cache-small"


def gated_architectures() -> dict[str, str]:
    """general.architecture -> the fixture row(s) whose gate cells cover it."""
    out: dict[str, str] = {}
    for name in ARCHS_WITH_FIXTURES:
        arch = ROWS[name].arch
        out[arch] = f"{out[arch]}, {name}" if arch in out else name
    return out


def breadth_matrix() -> list[GateCell]:
    """All architectures x one type, all weight types x two architectures: one cell each."""
    case = CASES[COLUMN_CASE]
    cells = [GateCell(FixtureSpec(arch, ARCH_COLUMN_QUANT), case) for arch in ARCHS_WITH_FIXTURES]
    cells += [GateCell(FixtureSpec(arch, quant), case) for quant in TYPE_COLUMN_QUANTS for arch in TYPE_COLUMN_ARCHS]
    return cells


def release_matrix() -> list[GateCell]:
    """Every fixture row in Q4_K_M and in the types of its real releases (`release_types`: declared once per
    row, with why), beyond the arch column's Q8_0: one cell each."""
    case = CASES[COLUMN_CASE]
    return [GateCell(FixtureSpec(name, quant), case) for name in ARCHS_WITH_FIXTURES
            for quant in release_types.row_types(name) if quant != ARCH_COLUMN_QUANT]


# The suite's share of release_matrix() (the rest is `bmoe-edge gates`), kept cheap (a K-quant fixture
# costs seconds to make): two flagships whose experts ship in MXFP4 (DeepSeek V4: hash routing,
# hyper-connections; Kimi K3: latent experts) in the release's own shape, and DeepSeek V4 in Q4_K_M.
# With the type column (test_archs.py), every type of the release matrix runs in the suite.
RELEASE_SAMPLE = (("deepseek4", "Q4_K_M"), ("deepseek4", "MXFP4"), ("kimi-k3", "MXFP4"))


def release_sample() -> list[GateCell]:
    return [c for c in release_matrix() if (c.fixture.arch, c.fixture.quant) in RELEASE_SAMPLE]


def full_matrix() -> list[GateCell]:
    cells = []
    for arch in CONFIG_ARCHS:
        for quant in QUANTS:
            spec = FixtureSpec(arch, quant)
            cells += [GateCell(spec, case) for case in CASES.values()]
        cells.append(GateCell(FixtureSpec(arch, "Q8_0", split=3), CASES["cache-small"]))
    for extra in (breadth_matrix(), release_matrix()):
        have = {(c.fixture, c.case.name) for c in cells}
        cells += [c for c in extra if (c.fixture, c.case.name) not in have]
    return cells + mtp_matrix()


def mtp_matrix() -> list[GateCell]:
    """Every MTP case on every MTP fixture, and prompt lookup on a hybrid (recurrent) trunk: its
    state cut back to the accepted drafts from llama.cpp's per-position snapshots."""
    return [GateCell(spec, case) for spec in MTP_FIXTURES for case in MTP_CASES.values()] + \
        [GateCell(FixtureSpec("qwen35moe", "Q8_0"), CASES["speculative-ngram"])]


CHAINED_MTP_ARCHS = ("step35",)


def mtp_sample() -> list[GateCell]:
    """The suite's share of mtp_matrix() (the rest is `bmoe-edge gates`): the single-head fixtures whole,
    and on the chained heads' fixtures one case per head (head j, case j: each head and each case once);
    prompt lookup on the hybrid trunk stays last."""
    cases = list(MTP_CASES.values())
    chained = [s for s in MTP_FIXTURES if s.arch in CHAINED_MTP_ARCHS]
    cells = mtp_matrix()
    return [c for c in cells[:-1] if c.fixture.arch not in CHAINED_MTP_ARCHS] + \
        [GateCell(s, cases[j % len(cases)]) for j, s in enumerate(chained)] + cells[-1:]


def sample_matrix() -> list[GateCell]:
    """A deterministic sample of the depth of `full_matrix()` for the test suite: every architecture
    of CONFIG_ARCHS, every weight type of QUANTS and every case of CASES once, and one split cell.

    Fixture i is (CONFIG_ARCHS[i], QUANTS[i % len(QUANTS)]): each architecture once, the types in
    turn (every type at least once). Case j, in CASES order, runs on fixture j % len(CONFIG_ARCHS);
    the split cell is the full matrix's (Q8_0, 3 shards, cache-small) on the next architecture in
    turn. The breadth (`breadth_matrix()`: every fixture row, every shipped weight type) is not
    sampled: the suite runs it whole. `bmoe-edge gates` still runs every cell."""
    fixtures = [FixtureSpec(arch, QUANTS[i % len(QUANTS)]) for i, arch in enumerate(CONFIG_ARCHS)]
    cells = [GateCell(fixtures[j % len(fixtures)], case) for j, case in enumerate(CASES.values())]
    split_arch = CONFIG_ARCHS[len(CASES) % len(CONFIG_ARCHS)]
    return [*cells, GateCell(FixtureSpec(split_arch, "Q8_0", split=3), CASES["cache-small"])]


def quick_matrix() -> list[GateCell]:
    """A representative subset for slow (emulated) targets: the quick fixtures, the risky configs
    (split files: the cache kept across two generations)."""
    cells = []
    for spec in QUICK_FIXTURES:
        names = ("two-generations",) if spec.split > 1 else QUICK_CASES
        cells += [GateCell(spec, CASES[name]) for name in names]
    return cells


RPC_WORKERS = 2
RPC_SPLIT = "1,1,1"  # this process, then each worker: a third of the layers each


def rpc_matrix(endpoints: str) -> list[GateCell]:
    """The quick fixtures with the first layers streamed here and the rest resident on RPC workers
    (`endpoints`, started by the caller: `bmoe-edge gates --rpc` starts two on loopback). Read-ahead
    is on: a guess stops at the last layer kept here (the next one's router is on a worker). The workers'
    rpc-server computes on llama.cpp's plain kernels (its buffers are the RPC backend's, never repacked), so the
    comparison is with the plain kernels on both sides (repack off)."""
    case = StreamCase(f"rpc-{len(endpoints.split(','))}-workers", cache=0.3,
                      overrides={"rpc": endpoints, "rpc_split": RPC_SPLIT, "overlap": True, "prefetch": "predict",
                                 "repack": "off"})
    return [GateCell(spec, case) for spec in QUICK_FIXTURES]


def stream_config(case: StreamCase, all_expert_bytes: int) -> StreamConfig:
    if any(case.overrides.get(s.name, s.default) != s.default for s in LOSSY_SETTINGS):
        raise BmoeError(f"gate case {case.name}: lossy settings ({', '.join(s.name for s in LOSSY_SETTINGS)}) have no "
                        "place in the gates: they compare against the lossless model")
    if case.cache == "auto":
        cache_mb: float | str = "auto"
        extra = {"cache_floor_mb": 0, "cache_ceil_mb": 64}
    else:
        cache_mb = float(case.cache) * all_expert_bytes / 2**20
        extra = {}
    return replace(BASE, stream=True, cache_mb=cache_mb, **extra, **case.overrides)


Prompt = str | list[int]


def _generate(engine: Engine, generations: int, steps: int, prompts: Sequence[Prompt] = PROMPTS) -> list[Generation]:
    return [engine.run(prompts[i % len(prompts)], steps, logits=True) for i in range(generations)]


def echo_prompts(resident: Sequence[Generation]) -> list[Prompt]:
    """Each prompt, the first half of the model's greedy continuation, the prompt again: a prompt-lookup
    draft then meets both what the model will say (accepted) and what it will not (rolled back)."""
    return [g.prompt_tokens + g.tokens[: len(g.tokens) // 2] + g.prompt_tokens for g in resident]


def _first_difference(a: list[Generation], b: list[Generation]) -> tuple[bool, bool, int | None, int]:
    equal_tokens = all(x.tokens == y.tokens for x, y in zip(a, b, strict=True))
    equal_logits = all(x.logits == y.logits for x, y in zip(a, b, strict=True))
    step = 0
    first = None
    for x, y in zip(a, b, strict=True):
        for i in range(max(len(x.logits), len(y.logits))):
            same = (i < len(x.logits) and i < len(y.logits) and x.logits[i] == y.logits[i]
                    and x.tokens[i:i + 1] == y.tokens[i:i + 1])
            if not same and first is None:
                first = step + i
        step += max(len(x.logits), len(y.logits))
    return equal_tokens, equal_logits, first, step


def speculating(config: StreamConfig, draft_model: str) -> StreamConfig:
    """`config` with the fixture's separate draft model where it speculates with the model's own drafts."""
    return replace(config, draft_model=draft_model) if config.speculative in ("mtp", "auto") else config


def check_cell(cell: GateCell, model: Path, resident: list[Generation], all_expert_bytes: int,
             steps: int, plain: list[Generation] | None = None, draft_model: str = "") -> CellResult:
    spec = cell.fixture
    result = CellResult(spec.label, spec.quant, spec.split, cell.case.name, passed=False)
    prompts = [g.prompt_tokens for g in resident] if cell.case.echo else LONG_PROMPTS if cell.case.long_prompt \
        else PROMPTS
    try:
        with Engine(model, speculating(stream_config(cell.case, all_expert_bytes), draft_model)) as engine:
            streamed = _generate(engine, cell.case.generations, steps, prompts)
            result.read_path = str(engine.run_info["read_path"])
            result.repack_layouts = str(engine.run_info["repack_layouts"])
            resolved = str(engine.run_info["repack"])
            result.flash_attn = bool(engine.run_info["flash_attn"])
    except BmoeError as exc:
        result.error = str(exc)
        return result
    eq_tokens, eq_logits, first, total = _first_difference(resident[: len(streamed)], streamed)
    if plain is not None and not all(x.tokens == y.tokens for x, y in zip(plain, streamed, strict=False)):
        eq_tokens = False
        first = 0 if first is None else first
    metrics = [m for g in streamed for m in g.metrics]
    lookups = sum(m.cache_lookups for m in metrics)
    result.equal_tokens, result.equal_logits, result.first_difference = eq_tokens, eq_logits, first
    result.steps = total
    result.bytes_read = sum(m.bytes_read for m in metrics)
    result.hit_pct = 100.0 * sum(m.cache_hits for m in metrics) / lookups if lookups else 0.0
    result.drafted = sum(m.drafted for m in metrics)
    result.accepted = sum(m.accepted for m in metrics)
    # The drafts depend on the draft's weights (an MTP head's experts are streamed too): step by step
    # the same as the resident run's.
    same_drafts = [(m.drafted, m.accepted, m.probed) for g in resident[: len(streamed)] for m in g.metrics] == \
        [(m.drafted, m.accepted, m.probed) for m in metrics]
    result.whole_graphs = sum(m.whole_graphs for m in metrics)
    as_declared = not cell.case.repack_resolves_to or resolved == cell.case.repack_resolves_to
    whole_as_declared = not cell.case.whole_graphs or result.whole_graphs > 0
    result.passed = eq_tokens and eq_logits and same_drafts and result.bytes_read > 0 and as_declared and \
        whole_as_declared
    if result.bytes_read == 0:
        result.error = "streamed run read nothing: the seam did not engage"
    elif not as_declared:
        result.error = f"repack auto resolved to {resolved}, not {cell.case.repack_resolves_to}"
    elif not whole_as_declared:
        result.error = "no decode ran as one graph, though the cache holds every expert"
    elif not same_drafts:
        result.error = "the drafts differ from the resident run's"
    return result


def run_gates(cells: Iterable[GateCell], resolve: Callable[[FixtureSpec], Path],
              steps: int = STEPS) -> Iterator[CellResult]:
    """Run cells grouped by fixture; yields each result as it completes."""
    by_fixture: dict[FixtureSpec, list[GateCell]] = {}
    for cell in cells:
        by_fixture.setdefault(cell.fixture, []).append(cell)
    for spec, group in by_fixture.items():
        model = resolve(spec)
        draft_model = draft_model_for(spec, model)
        all_expert_bytes = info.model_summary(model).expert_bytes
        most = max(c.case.generations for c in group)
        resident: dict[tuple[object, ...], list[Generation]] = {}

        def baseline(config: StreamConfig, echo: bool, speculative: str, long_prompt: bool, resolves_to: str = "",
                     model: Path = model,
                     most: int = most, resident: dict = resident, draft_model: str = draft_model) -> list[Generation]:
            """Resident runs by the knobs cases change: echoed prompts, speculation, long prompts, and the
            config's KERNEL_SETTINGS (threads; repacked or plain kernels; flash attention or not: their floats
            differ)."""
            kernels = {name: getattr(config, name) for name in KERNEL_SETTINGS}
            if kernels["repack"] == "auto":
                kernels["repack"] = resolves_to
            key = (*kernels.values(), echo, speculative, long_prompt)
            if key not in resident:
                prompts = echo_prompts(baseline(config, False, "off", False, resolves_to)) if echo else \
                    LONG_PROMPTS if long_prompt else PROMPTS
                run = speculating(replace(BASE, stream=False, speculative=speculative, **kernels), draft_model)
                with Engine(model, run) as engine:
                    resident[key] = _generate(engine, most, steps, prompts)
            return resident[key]

        for cell in group:
            config = stream_config(cell.case, all_expert_bytes)
            same = baseline(config, cell.case.echo, config.speculative, cell.case.long_prompt,
                            cell.case.repack_resolves_to)
            # Speculation verifies drafts in batched decodes, whose float rounding may differ from one
            # token at a time: its logits are compared with a resident run that speculates too, its
            # tokens also with plain decoding.
            plain = baseline(config, cell.case.echo, "off", cell.case.long_prompt, cell.case.repack_resolves_to)
            yield check_cell(cell, model, same, all_expert_bytes, steps, plain, draft_model)


def emulated_gate_args(bundle_dir: Path, as_json: bool) -> list[str]:
    """`bmoe-edge gates` arguments that run a bundle's quick matrix on its own fixtures."""
    args = ["gates", "--quick", "--fixtures", str((bundle_dir / "fixtures").resolve())]
    return [*args, "--json"] if as_json else args


def format_result(r: CellResult) -> str:
    line = (f"{'PASS' if r.passed else 'FAIL'} {r.arch:<9} {r.quant:<7} split={r.split} {r.config:<16} "
            f"steps={r.steps:<3} read={r.bytes_read / 2**20:6.2f}MiB hit={r.hit_pct:5.1f}% {r.read_path}")
    if r.error:
        return f"{line}  {r.error}"
    if not r.passed:
        return f"{line}  first difference at step {r.first_difference}"
    return line


def as_record(result: CellResult) -> dict:
    return asdict(result)
