"""Benchmark smoke tests: `bench io` and `bench stream` on a tiny model write their files and columns.

Timing is not checked (these are commands, not timed tests); the campaign lives in bench-data/.
"""

from __future__ import annotations

import csv
import getpass
import json
import os
import platform
import re
import socket
import sys
from dataclasses import replace
from pathlib import Path

import gguf
import pytest

from bmoe_edge.bench import layout, machine, ramcap, routing
from bmoe_edge.synthetic import bigmoe

from conftest import assert_clean_error, run_cli

needs_native = pytest.mark.usefixtures("native")  # conftest: fails, never skips, without the build
SMALL = {"n_layer": 2, "vocab_size": 512, "n_embd": 256, "n_ff_exp": 256}


@pytest.fixture(scope="module")
def small_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench-models")
    return {
        "uniform": bigmoe.write_preset(root / "uniform.gguf", "qwen3-30b-a3b-3g", "Q4_0", **SMALL).path,
        "skewed": bigmoe.write_preset(root / "skewed.gguf", "qwen3-30b-a3b-3g", "Q4_0", routing_skew=0.8,
                                      **SMALL).path,
    }


def _columns(path: Path) -> list[str]:
    with open(path, newline="") as f:
        return next(csv.reader(f))


@needs_native
def test_preset_shapes_and_layout_match_the_gguf_reader(small_models: dict[str, Path]) -> None:
    d = bigmoe.resolve_dims("qwen3-30b-a3b-3g", "Q4_0")
    assert (d.n_layer, d.n_embd, d.n_expert, d.n_expert_used, d.n_ff_exp) == (22, 1536, 64, 8, 768)
    assert bigmoe.expert_slice_bytes(d, "Q4_0") == 663_552  # the reference slice
    assert 2.8e9 < bigmoe.estimate_bytes(d, "Q4_0") < 3.0e9
    for quant in ("Q4_0", "Q4_K"):
        assert bigmoe.expert_slice_bytes(d, quant) == 663_552
    # The flagship's shape: Qwen3-30B-A3B's own dimensions, ~17 GB in Q4_K (written by the campaign only).
    f = bigmoe.resolve_dims("qwen3-30b-a3b-17g", "Q4_K")
    assert (f.n_layer, f.n_embd, f.n_expert, f.n_expert_used, f.n_ff_exp, f.n_head, f.n_head_kv, f.head_dim,
            f.n_vocab) == (48, 2048, 128, 8, 768, 32, 4, 128, 32000)
    assert bigmoe.expert_slice_bytes(f, "Q4_K") == 884_736
    assert 16.5e9 < bigmoe.estimate_bytes(f, "Q4_K", f.n_vocab) < 17.5e9

    path = small_models["skewed"]
    model = layout.gguf_layout(path)
    reader = gguf.GGUFReader(path)
    by_name = {t.name: t for t in reader.tensors}
    assert len(model.experts) == 3 * SMALL["n_layer"]
    assert [(t.layer, t.projection) for t in model.experts] == sorted((t.layer, t.projection) for t in model.experts)
    for t in model.experts:
        ref = by_name[t.name]
        assert t.offset == int(ref.data_offset)
        assert t.slice_bytes * t.n_expert == int(ref.n_bytes)
        assert t.n_expert == 64
    assert model.n_expert_used == 8
    assert model.metadata["bmoe.routing.mode"] == "shaped"
    assert abs(model.metadata["bmoe.routing.skew"] - 0.8) < 1e-6


def test_routing_plans_hit_their_targets_in_simulation() -> None:
    d = replace(bigmoe.resolve_dims("qwen3-30b-a3b-3g", "Q4_0"), n_embd=256)
    random_plan = bigmoe.plan_routing(d, 0.0, None)
    assert not random_plan.shaped and random_plan.mode == "random"
    plan = bigmoe.plan_routing(d, 0.8, 0.4)
    assert plan.shaped and abs(plan.sim_repeat - 0.4) < 0.03 and abs(plan.sim_zipf - 0.8) < 0.1
    targets = bigmoe.zipf_targets(64, 8, 1.0)
    assert abs(targets.sum() - 8) < 1e-6 and targets.max() <= 1.0


def test_cache_replay_and_routing_stats() -> None:
    # Two layers: the layer in flight is never evicted, so a budget of 0 keeps nothing across tokens.
    trace = [[[0, 1], [5]], [[0, 2], [5]], [[0, 1], [6]], [[3, 4], [6]]]
    assert routing.cache_hit_rate(trace, [100, 100], 8, 0) == 0.0
    assert routing.cache_hit_rate(trace, [100, 100], 8, 10_000) == 5 / 12  # 0, 5, 0, 1, 6
    # A share of one expert per layer (200 bytes): each layer keeps its most recent expert.
    assert routing.cache_hit_rate(trace, [100, 100], 8, 200) == 2 / 12  # 5 and 6 on layer 1
    stats = routing.routing_stats(trace, n_expert=8, k=2)
    assert stats["tokens"] == 4 and 0 < stats["prev_token_reuse"] < 1


def test_parse_cap() -> None:
    assert ramcap.parse_cap("40%", 1000) == 400
    assert ramcap.parse_cap("1200", 0) == 1200 * 2**20
    assert ramcap.parse_cap("1.5GB", 0) == int(1.5 * 1024) * 2**20
    with pytest.raises(Exception, match="ram-cap"):
        ramcap.parse_cap("lots", 0)


def test_tiny_model_without_arch_or_preset_fails_cleanly(tmp_path: Path) -> None:
    assert_clean_error(run_cli("tiny-model", "-o", str(tmp_path / "x.gguf")), "--preset")


def test_bench_io_writes_its_table(small_models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "io"
    result = run_cli("bench", "io", "-m", str(small_models["uniform"]), "--sizes", "4k,slice", "--lanes", "1,2",
                     "--seconds", "0.2", "--out", str(out), timeout=60)
    assert result.returncode == 0, result.stderr
    cols = _columns(out / "io.csv")
    for c in ("mode", "size", "lanes", "reads", "bytes", "mib_s", "lat_p50_ms", "lat_p99_ms", "storage_bytes"):
        assert c in cols
    rows = machine.read_csv(out / "io.csv")
    assert {r["mode"] for r in rows} == {"odirect", "pread"}
    assert {int(r["size"]) for r in rows} == {4096, 256 * 256 // 32 * 18}
    assert all(int(r["reads"]) > 0 for r in rows)
    assert "| mode | size |" in result.stdout


@needs_native
def test_bench_stream_writes_csvs_summary_and_plots(small_models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "stream"
    usable = ramcap.memory_cgroup_v1() is not None or ramcap.cgroup_v2() is not None
    cap = "400" if usable else "0"  # MiB: the tiny model fits; the point is the cap machinery
    cells = ("resident,mmap,off-serial-od4,off-overlap-od1,cache1-overlap-od4,fullcache-serial,fullcache-paired,io-od4,"
             "long-prompt-96,long-prompt-96-resident,pfauto-paired-predict")
    result = run_cli("bench", "stream", "-m", str(small_models["uniform"]), "--ram-cap", cap, "--tokens", "4",
                     "--repeats", "1", "--budgets", "1", "--cells", cells, "--io-seconds", "0.1",
                     "--long-prompts", "96", "--out", str(out), timeout=120)
    assert result.returncode == 0, result.stderr
    for name in ("cells.csv", "tokens.csv", "io.csv", "run.json", "summary.md", "targets.json", "tokps.png",
                 "hitrate.png", "split.png"):
        assert (out / name).is_file(), name
    rows = machine.read_csv(out / "cells.csv")
    assert {r["label"] for r in rows} == set(cells.split(","))
    assert all(r["status"] == "ok" for r in rows), [(r["label"], r["error"]) for r in rows]
    for col in ("tok_s", "bytes_read_per_token", "cache_hit_pct", "io_ms_per_token", "stall_ms_per_token",
                "compute_ms_per_token", "major_faults_per_token", "peak_rss_bytes", "process_threads",
                "loadavg_before", "cap_method"):
        assert col in rows[0]
    by = {r["label"]: r for r in rows}
    assert float(by["off-serial-od4"]["bytes_read_per_token"]) > 0
    # Cache off: --repack auto keeps the experts on the plain kernels (a slice read and used once costs more to
    # convert than its kernel saves), and the slices land in place, zero-copy.
    assert float(by["off-serial-od4"]["copy_bytes_per_token"]) == 0
    assert float(by["fullcache-serial"]["cache_hit_pct"]) == 100.0
    # A long-prompt cell: its prompt of 96 tokens, what it read against the distinct experts it routed
    long = by["long-prompt-96"]
    assert int(long["prompt_tokens"]) == 96 and float(long["ttft_ms"]) >= float(long["prompt_ms"]) > 0
    assert int(long["prefill_routed_bytes"]) > 0 and int(long["prefill_bytes"]) > 0
    assert float(by["long-prompt-96-resident"]["prompt_ms"]) > 0  # the compute side of its bound
    # The paired cell: resident and full cache in one process, token by token, the same tokens.
    assert by["fullcache-paired"]["paired_same_tokens"] == "True"
    assert float(by["fullcache-paired"]["paired_ratio"]) > 0 and float(by["fullcache-paired"]["tok_s"]) > 0
    # Read-ahead auto beside predict in one process: its total-time ratio is a policy target.
    assert by["pfauto-paired-predict"]["paired_same_tokens"] == "True"
    assert float(by["pfauto-paired-predict"]["paired_mean_ratio"]) > 0
    if usable:
        assert by["mmap"]["cap_method"].startswith("cgroup") and by["resident"]["cap_method"] == "none"
    tok_cols = _columns(out / "tokens.csv")
    assert tok_cols[:2] == ["label", "repeat"] and "wall_ms" in tok_cols and "storage_bytes" in tok_cols
    summary = (out / "summary.md").read_text()
    assert "## Targets" in summary and "P4 zero copy" in summary
    assert "P1 resident parity (fullcache-paired vs resident, per-token ratio in one process" in summary
    assert "pfauto-paired-predict vs the best simpler setting (prefetch predict, in the same process)" in summary
    long_table = summary.split("## Long prompts")[1].split("\n## ")[0]
    [row] = [line for line in long_table.splitlines() if line.startswith("| long-prompt-96 |")]
    assert row.split("|")[-3].strip() != "-" and float(row.split("|")[-2]) > 0  # resident prefill s, TTFT x bound
    assert "Issue 4 overlap" not in summary or "io-only" in summary
    _check_the_campaign_s_card(out, small_models["uniform"], set(cells.split(",")))


def _check_the_campaign_s_card(out: Path, model: Path, labels: set[str]) -> None:
    """`bench report`: the card of the campaign just run, nothing in it that identifies the machine or its user,
    and two cards compared."""
    result = run_cli("bench", "report", str(out))
    assert result.returncode == 0, result.stderr
    card = json.loads((out / "card.json").read_text())
    text = (out / "card.md").read_text() + json.dumps(card)
    assert result.stdout == (out / "card.md").read_text()
    assert {c["label"] for c in card["cells"]} == labels
    assert all(c["tok_s"] > 0 for c in card["cells"] if not c["label"].startswith("io-"))
    assert card["model"]["architecture"] == "qwen3moe" and card["model"]["quant"] and card["model"]["experts"] > 0
    assert card["machine"]["cores"] == os.cpu_count() and card["machine"]["kernel_page_kb"] > 0
    assert card["storage"]["measured"], card["storage"]
    run = json.loads((out / "run.json").read_text())
    identifying = {socket.gethostname(), platform.node(), getpass.getuser(), str(out), str(model), model.name,
                   str(Path.home()), run["machine"].get("device", "\0"), " ".join(run["argv"])}
    found = [s for s in identifying if s and re.search(rf"(?<![\w.-]){re.escape(s)}(?![\w.-])", text)]
    assert not found, found
    assert not re.search(r"(^|[\s'\"(])/[\w.-]+/", text), "a path in the card"
    both = run_cli("bench", "report", str(out), str(out / "card.json"))
    assert both.returncode == 0, both.stderr
    rows = [line for line in both.stdout.splitlines() if line.startswith("| x") or line.startswith("| aarch")]
    assert len(rows) == 2 * len(labels), both.stdout
    (out / "other.json").write_text('{"card": 99}')
    assert_clean_error(run_cli("bench", "report", str(out / "other.json")), "not a bench report card")
    assert_clean_error(run_cli("bench", "report", str(out / "missing")), "not a")


def _noting_python(tmp_path: Path) -> tuple[list[str], Path]:
    """A Python started through a wrapper, as an emulated board's cells start theirs (its exec wrapper first): a
    program that notes its arguments and runs them."""
    log = tmp_path / "wrapper.log"
    return ["sh", "-c", f'echo "$*" >> {log}; exec "$@"', "wrapper", sys.executable], log


@needs_native
def test_routing_trace_shows_the_shaped_router(small_models: dict[str, Path], tmp_path: Path) -> None:
    python, log = _noting_python(tmp_path)
    uniform = routing.routing_report(small_models["uniform"], 60, tmp_path / "u")
    skewed = routing.routing_report(small_models["skewed"], 60, tmp_path / "s", python=python)
    assert "-m bmoe_edge bench cell" in log.read_text()   # the trace's Python started as the campaign's cells
    assert uniform["tokens"] == 59 and (tmp_path / "u" / "routing.csv").is_file()
    assert uniform["prev_token_reuse"] < 0.2 < skewed["prev_token_reuse"]
    assert skewed["top_eighth_share_median"] > uniform["top_eighth_share_median"]
    assert json.loads((tmp_path / "s" / "routing.json").read_text())["model_metadata"]["bmoe.routing.skew"] > 0


@needs_native
@pytest.mark.parametrize("quant", ["Q4_0", "Q4_K"])
def test_preset_models_stream_bit_identically(quant: str, tmp_path: Path) -> None:
    from bmoe_edge.engine import Engine, StreamConfig

    path = bigmoe.write_preset(tmp_path / f"{quant}.gguf", "qwen3-30b-a3b-3g", quant, routing_skew=0.8,
                               **SMALL).path
    runs = []
    for config in (StreamConfig(stream=False, threads=1), StreamConfig(cache_mb=0, threads=1, io_threads=2)):
        with Engine(path, config) as engine:
            runs.append(engine.run("Once upon a time", 16, logits=True))
    assert runs[0].tokens == runs[1].tokens and runs[0].logits == runs[1].logits
    assert len(set(runs[0].tokens)) == 16  # the successor cycle: no loop that would flatter a cache


def _throttle_or_skip() -> None:
    from bmoe_edge.errors import BmoeError

    try:
        ramcap.read_throttle_parent()
    except BmoeError as exc:
        pytest.skip(f"no blkio controller to throttle with here: {exc}")


def test_storage_classes_resolve_and_bad_ones_fail_cleanly(tmp_path: Path) -> None:
    from bmoe_edge.bench import storage
    from bmoe_edge.cli.bench import storage_targets

    named = storage_targets()
    gen2 = storage.parse_storage("rpi5-nvme-gen2", named)  # type: ignore[arg-type]
    assert gen2 is not None and (gen2.read_mb_s, gen2.read_iops) == (430, 50000)
    assert storage.parse_storage("rpi5", named) == gen2  # type: ignore[arg-type]  # the board's is its class
    assert storage.parse_storage("90:5000", {}) == storage.StorageTarget("90MB/s:5000", 90.0, 5000)
    assert storage.parse_storage("native", {}) is None
    assert {"microsd", "rpi5-nvme-gen3", "rpi5-nvme-gen2"} <= set(named)
    if os.major(os.stat(__file__).st_dev):  # a checkout on a disk (not an overlay): its whole disk
        assert re.fullmatch(r"\d+:\d+", storage.block_device(Path(__file__)))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert_clean_error(run_cli("bench", "stream", "-m", str(model), "--ram-cap", "0", "--storage", "floppy"),
                       "is not a storage class", "rpi5-nvme-gen2")
    assert_clean_error(run_cli("bench", "stream", "-m", str(model), "--ram-cap", "0", "--board", "abacus"),
                       "unknown board profile 'abacus'")
    if Path("/dev/shm").is_dir():
        on_tmpfs = Path("/dev/shm") / f"storage-test-{os.getpid()}.gguf"
        on_tmpfs.write_bytes(b"GGUF")
        try:
            with pytest.raises(Exception, match="no block device to throttle"):
                storage.block_device(on_tmpfs)
        finally:
            on_tmpfs.unlink()


@needs_native
def test_bench_stream_cell_runs_at_a_storage_class(small_models: dict[str, Path], tmp_path: Path) -> None:
    """One throttled cell on the tiny model: the cgroup's reads are held to the class's bandwidth."""
    _throttle_or_skip()
    out = tmp_path / "throttled"
    mb_s = 20  # the 2-layer model reads ~1.7 MB per token cache off: ~85 ms of I/O per token at 20 MB/s
    result = run_cli("bench", "stream", "-m", str(small_models["uniform"]), "--ram-cap", "0", "--tokens", "6",
                     "--repeats", "1", "--cells", "off-serial-od4", "--storage", str(mb_s),
                     "--out", str(out), timeout=120)
    assert result.returncode == 0, result.stderr
    row = machine.read_csv(out / "cells.csv")[0]
    assert row["status"] == "ok", row["error"]
    assert row["storage"] == f"{mb_s}MB/s" and row["throttle"].endswith(("(blkio-v1)", "(io-v2)"))
    assert int(row["throttled_read_bytes"]) > 0
    # The engine's own read rate while reading: at most the class (+10% for the throttle's first slice).
    assert 0 < float(row["read_mib_s"]) * 2**20 / 1e6 <= mb_s * 1.1, row["read_mib_s"]
    meta = json.loads((out / "run.json").read_text())
    assert meta["storage"]["read_mb_s"] == mb_s and meta["read_limit"]["read_bps"] == mb_s * 1_000_000
    assert f"## At the storage class {mb_s}MB/s" in (out / "summary.md").read_text()


def test_storage_check_measures_the_throttle(small_models: dict[str, Path]) -> None:
    """The cross-check's three read paths, in a throttled child: each within reach of the limit."""
    import subprocess
    import sys

    from bmoe_edge.bench import storage

    _throttle_or_skip()
    model = small_models["uniform"]
    target = storage.StorageTarget("test", 40.0)
    cap = ramcap.make_cap(0, "auto", storage.read_limit(target, model))
    cap.prepare()
    code = ("import json, sys; from pathlib import Path; from bmoe_edge.bench.storage import storage_check; "
            "print(json.dumps(storage_check(Path(sys.argv[1]), seconds=1.0)))")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(model)], preexec_fn=cap.preexec,
                              capture_output=True, text=True, timeout=60)
    finally:
        result = cap.finish()
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    verdict = storage.check_verdict(record, target)
    assert result.throttled_read_bytes > 0 and "40000000 B/s" in result.throttle
    for path in ("odirect", "buffered", "mmap"):  # a 1 s window: the first slice and the tail blur it
        assert 0.5 < verdict[f"{path}_ratio"] < 1.3, (path, record)


def test_the_held_out_check_takes_the_best_one_knob_rival_and_the_fewest_bytes() -> None:
    """Issue 48's check (summary.one_knob_targets), per repeat: `defaults` over the best of DEFAULTS_RIVALS, and
    over the class's bandwidth / the fewest bytes per token any of them read."""
    from bmoe_edge.bench import summary
    from bmoe_edge.bench.cells import DEFAULTS_RIVALS

    def row(label: str, repeat: int, tok_s: float, mb: float) -> dict[str, str]:
        return {"label": label, "kind": "stream", "repeat": str(repeat), "status": "ok", "tok_s": str(tok_s),
                "bytes_read_per_token": str(mb * 1e6)}

    cells = [row("defaults", 0, 1.70, 240), row("defaults", 1, 1.80, 240)]
    cells += [row(label, r, 1.75 + 0.1 * r if label == "defaults-prefetch-off" else 1.2, 230 if i == 0 else 330)
              for i, label in enumerate(DEFAULTS_RIVALS) for r in (0, 1)]
    t = summary.one_knob_targets(cells, summary.aggregate(cells), {"storage": {"read_mb_s": 430}})["one_knob"]
    assert [x["best"] for x in t["by_repeat"]] == ["defaults-prefetch-off"] * 2
    assert t["ratio"] == pytest.approx((1.70 / 1.75 + 1.80 / 1.85) / 2)
    # The I/O limit from the fewest bytes any of them read (230 MB, the prefetch-off cell's): 430 / 230 tok/s.
    assert t["io_ratio"] == pytest.approx((1.70 + 1.80) / 2 / (430 / 230))
    assert summary.one_knob_targets(cells[:2], summary.aggregate(cells[:2]), {}) == {}  # no rival, no verdict


def test_the_balloon_starts_its_python_as_the_campaign_s_cells(tmp_path: Path) -> None:
    python, log = _noting_python(tmp_path)
    cap = ramcap.make_cap(machine.mem_info()["MemAvailable"] - 32 * 2**20, "balloon", python=python)
    cap.prepare()
    result = cap.finish()
    assert result.note.startswith("balloon ") and "-m bmoe_edge.bench.ramcap balloon" in log.read_text()
