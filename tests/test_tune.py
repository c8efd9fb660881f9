"""`bmoe-edge tune`: real measurements on this machine (quick mode: a few seconds), the profile it writes
resolved by the profile loader, bad inputs, and `tune --host` on the emulated board (a real sshd in front
of qemu-aarch64, the deployed qemu-arm64 bundle measuring itself).

Every run gets its own $XDG_CONFIG_HOME (and conftest points every test at a per-session one): nothing
here touches the real ~/.config/bmoe-edge/profiles.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from bmoe_edge.bench import layout, machine, ramcap
from bmoe_edge.boards import profiles
from bmoe_edge.engine import memlimits
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import commands, emulated_board, remote
from bmoe_edge.fleet import targets as fleet_targets
from bmoe_edge.synthetic import tinymoe
from bmoe_edge.tune import local, measure, rules

import test_deploy
from conftest import assert_clean_error, run_cli

TUNED = ("io_threads", "threads", "read_path", "cache_margin_mb")
BENCH_SHAPED = f"tune-{local.BENCH_PRESET}-{local.BENCH_LAYERS}l-Q4_0.gguf"   # tune's compute model without -m


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (profiles.PROFILES_ENV, profiles.BOARD_ENV)}
    return dict(env, XDG_CONFIG_HOME=str(tmp_path / "config"), **extra)


def _assert_matches(profile: profiles.BoardProfile, choice: dict, shipped: profiles.BoardProfile) -> None:
    """The tuned profile has what was chosen, and the shipped profile's value where tune left a field alone."""
    for key in TUNED:
        assert profile.engine.get(key) == (shipped.engine.get(key) if choice[key] is None else choice[key]), key
    want = shipped.storage.read_mb_s if choice["read_mb_s"] is None else choice["read_mb_s"]
    assert profile.storage.read_mb_s == want


def _assert_threads_not_below_the_best(report: dict) -> None:
    """Threads come from streaming decode of a benchmark-shaped model: the best median, or left alone
    when the profile's own count (auto: one core left to the read lanes) is within the best's spread."""
    stream = [measure.ComputeCell(**{**c, "samples": tuple(c["samples"])}) for c in report["compute"]
              if c["mode"] == "stream"]
    assert stream, report["compute"]
    best = max(stream, key=lambda c: (c.tok_s, -c.threads))
    tied = {c.threads for c in stream if c.high >= best.low}
    chosen = report["choice"]["threads"]
    if chosen is None:
        own = report["before"]["threads"] or 0
        assert rules.streaming_threads(own, report["machine"]["cores"]) in tied, (own, tied)
        assert "threads" in report["choice"]["left"]
    else:
        assert chosen == best.threads


# ---------------------------------------------------------------------------------------------------
# This machine, for real.


def test_tune_measures_this_machine_and_writes_a_profile_the_loader_resolves(tmp_path: Path) -> None:
    env = _env(tmp_path)
    scratch = tmp_path / "scratch"
    started = time.monotonic()
    result = run_cli("tune", "--quick", "--dir", str(scratch), "--json", env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    print(f"\ntune --quick: {time.monotonic() - started:.1f} s")
    # what it measured: both read paths (O_DIRECT works on this disk) at 1..2x cores lanes, 1..cores threads
    cores = os.cpu_count() or 1
    lanes = list(range(1, min(2 * cores, measure.MAX_LANES) + 1))
    for mode in ("odirect", "pread"):
        cells = [c for c in report["io"] if c["mode"] == mode]
        assert sorted(c["lanes"] for c in cells) == lanes and all(c["mib_s"] > 0 and c["reads"] > 0 for c in cells)
    assert sorted(c["threads"] for c in report["compute"] if c["mode"] == "stream") == list(range(1, cores + 1))
    assert all(c["tok_s"] > 0 and c["samples"] for c in report["compute"])
    # compute ran on a benchmark-shaped model (real expert slices), never on the tiny fixture
    assert {t.slice_bytes for t in layout.gguf_layout(Path(report["fixture"])).experts} == {663552}
    assert Path(report["fixture"]).name == BENCH_SHAPED
    facts = report["machine"]
    assert facts["page_size"] == os.sysconf("SC_PAGE_SIZE") and facts["cores"] == cores
    assert facts["ram_mb"] == machine.mem_info()["MemTotal"] // 2**20
    assert not list(scratch.iterdir())    # the scratch file is gone
    # what it chose follows the rules from what it measured
    choice = report["choice"]
    io = [measure.IoCell(**c) for c in report["io"]]
    curve = rules.lane_curve(io, choice["read_path"])
    assert choice["io_threads"] == min(n for n, v in curve.items() if v >= 0.95 * max(curve.values()))
    _assert_threads_not_below_the_best(report)
    assert not report["warnings"] and set(choice["left"]) <= {"threads"}
    # the profile: in the user profile directory, `extends: host`, resolved by the loader with the values
    written = tmp_path / "config" / "bmoe-edge" / "profiles" / "host.yaml"
    assert report["written"] == [str(written)]
    own = yaml.safe_load(written.read_text())
    assert own["extends"] == "host" and set(own) >= {"storage", "engine"}
    assert set(own["engine"]) == {key for key in TUNED if choice[key] is not None}
    assert set(own["storage"]) == {"read_mb_s"}
    dirs = profiles.profile_dirs(environ=env)
    assert dirs[0] == written.parent.resolve()
    host = profiles.load_profile("host", dirs)
    assert host.source == written.resolve()
    shipped = profiles.load_profile("host", [profiles.shipped_dir()])
    _assert_matches(host, choice, shipped)
    assert (host.ram_mb, host.storage.kind, host.ssh) == (shipped.ram_mb, shipped.storage.kind, shipped.ssh)
    # the CLI sees it too: `profiles show host` with only the environment pointing at it
    shown = run_cli("profiles", "show", "host", "--json", env=env)
    assert shown.returncode == 0 and json.loads(shown.stdout)["engine"]["io_threads"] == choice["io_threads"]


def test_the_table_shows_what_was_measured_and_chosen(tmp_path: Path) -> None:
    out = tmp_path / "mine" / "bench-box.yaml"
    result = run_cli("tune", "--quick", "--dir", str(tmp_path), "--out", str(out), env=_env(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for needle in ("memory", "RAM ", "page size 4 KiB" if os.sysconf("SC_PAGE_SIZE") == 4096 else "page size",
                   "effective limit", "reads, MiB/s", "odirect  648 KiB", "pread    648 KiB", "1 lane",
                   "compute, decode tok/s", "stream ", "threads", "chosen", "read_path", "io_threads",
                   "storage.read_mb_s", "engine.cache_margin_mb", f"wrote {out}"):
        assert needle in text, (needle, text)
    print("\n" + text)
    # the --out file is a profile named after the file, extending host, with the table's values
    p = profiles.load_profile_file(out, [profiles.shipped_dir()])
    assert (p.name, p.source) == ("bench-box", out.resolve())
    cols = [re.split(r"\s{2,}", row.strip()) for row in text.split("\nchosen\n")[1].splitlines()[1:] if row.strip()]
    now = {c[0].rpartition(".")[2]: c[2] for c in cols if c[0].startswith(("engine.", "storage."))}
    own = yaml.safe_load(out.read_text())
    assert {k: v for k, v in now.items() if v != "(left alone)"} == {
        **{key: str(p.engine[key]) for key in own["engine"]}, "read_mb_s": str(p.storage.read_mb_s)}
    assert all(key not in own["engine"] for key, v in now.items() if v == "(left alone)")
    assert not (tmp_path / "config").exists()   # --out: the user directory is untouched


def test_a_model_is_read_at_its_slice_sizes_and_the_cgroup_limit_is_found(tmp_path: Path) -> None:
    """-m: its slice sizes, and (it fits) compute on it; run inside a memory cgroup with a 3 GiB limit,
    which is reported and sizes the margin. The tiny fixture's figures do not carry over: a warning, and
    the read fields and threads are left alone."""
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    slices = sorted({t.slice_bytes for t in layout.gguf_layout(model).experts})
    try:
        cap = ramcap.make_cap(3 << 30, "auto")
    except BmoeError:
        cap = ramcap.NoCap()     # no writable memory cgroup here: the limit is not checked
    cap.prepare()
    try:
        result = run_cli("tune", "--quick", "-m", str(model), "--no-write", "--json", env=_env(tmp_path),
                         timeout=120, preexec_fn=cap.preexec)
    finally:
        cap.finish()
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sizes"] == slices[-1:]            # --quick: the largest slice only
    assert {c["size"] for c in report["io"]} == set(slices[-1:])
    assert report["read_file"] == str(model) and report["fixture"] == str(model)   # compute on it
    assert {c["mode"] for c in report["compute"]} == {"stream", "resident"}          # it fits: resident too
    assert report["written"] == [] and not (tmp_path / "config").exists()
    # a toy: its slices are tiny and it fits in memory many times over; said in one line, fields left alone
    choice = report["choice"]
    assert set(choice["left"]) == {"read_path", "io_threads", "read_mb_s", "threads"}
    assert all(choice[key] is None for key in choice["left"]) and choice["cache_margin_mb"] > 0
    warned = [ln for ln in result.stderr.splitlines() if ln.startswith("warning: ")]
    assert len(warned) == 1 and "won't carry over" in warned[0], result.stderr
    assert "left alone: read_path, io_threads, read_mb_s, threads" in warned[0]
    own = yaml.safe_load(report["profile_yaml"])
    assert "storage" not in own and set(own["engine"]) == {"cache_margin_mb"}
    if cap.method != "none":
        limits = report["machine"]["limits"]
        assert any(lim["mb"] == 3072 and "cgroup" in lim["source"] for lim in limits), limits
        before = report["before"]     # read fields left alone: the margin of the profile's read path and lanes
        assert choice["cache_margin_mb"] == rules.cache_margin(before["read_path"], before["io_threads"],
                                                              report["sizes"], 3072)


# ---------------------------------------------------------------------------------------------------
# The rules and the search order (plain functions).


def _cells(mode: str, by_lanes: dict[int, float]) -> list[measure.IoCell]:
    return [measure.IoCell(mode, 648 << 10, n, v, 100) for n, v in by_lanes.items()]


MACHINE = measure.Machine("b", "aarch64", 4, 8064, 7000, 16384,
                          (memlimits.MemoryLimit("cgroup v2 /x memory.max", 4096),), None)


def _stream(by_threads: dict[int, tuple[float, ...]]) -> list[measure.ComputeCell]:
    import statistics

    return [measure.ComputeCell(n, statistics.median(v), "stream", v) for n, v in by_threads.items()]


def test_choice_rules() -> None:
    compute = _stream({1: (5.0, 5.1), 2: (9.0, 9.2), 3: (9.0, 9.1), 4: (8.0, 8.2)})
    odirect = _cells("odirect", {1: 300, 2: 560, 3: 590, 4: 600, 5: 598})
    c = rules.choose([*odirect, *_cells("pread", {1: 250, 2: 640, 3: 650})], "", compute, MACHINE, [648 << 10], 4096)
    # pread is faster, but not by more than 10%: O_DIRECT; 3 lanes are within 5% of the best (600)
    assert (c.read_path, c.io_threads, c.read_mb_s) == ("odirect", 3, round(590 * 2**20 / 1e6))
    assert c.threads is None and "threads" in c.left        # the profile's auto (3 of 4 cores) ties the best
    c = rules.choose(odirect, "", compute, MACHINE, [648 << 10], 4096, before={"threads": 1})
    assert c.threads == 2                                   # the best median; the fewer threads on a tie
    assert c.cache_margin_mb == 112                         # 64 + 1% of the 4096 MiB limit, up to 16 MiB
    assert c.page_size == 16384                             # the kernel's differs from the profile's
    c = rules.choose([*odirect, *_cells("pread", {1: 400, 2: 700})], "", compute, MACHINE, [648 << 10], 16384)
    assert (c.read_path, c.io_threads, c.page_size) == ("pread", 2, None)    # 700 > 1.1 x 600
    assert c.cache_margin_mb == 112 and rules.cache_margin("pread", 8, [8 << 20], 4096) == 240   # + 2*8*8 MiB
    c = rules.choose(_cells("pread", {1: 100, 2: 101}), "O_DIRECT open failed: Invalid argument", compute,
                    MACHINE, [648 << 10], 16384)
    assert (c.read_path, c.io_threads) == ("pread", 1) and "Invalid argument" in c.why["read_path"]
    assert MACHINE.effective_mb == 4096


def test_a_thread_count_far_behind_is_not_measured_again() -> None:
    got = {("stream", 1): [30.0], ("stream", 2): [2.0], ("resident", 1): [40.0], ("resident", 2): [25.0]}
    assert measure._far_behind(got, "stream", 2) and not measure._far_behind(got, "stream", 1)
    assert not measure._far_behind(got, "resident", 2)        # 25 is not below half of 40


def test_a_toy_models_figures_are_left_alone(tmp_path: Path) -> None:
    """Issue #35: the tiny fixture decodes fastest on one thread and its 10 KiB reads are IOPS-bound;
    none of that is written as the machine's. A real-shaped model bigger than memory / 16 is measured."""
    def sparse(name: str, size: int) -> Path:
        path = tmp_path / name
        with open(path, "wb") as f:
            f.truncate(size)
        return path

    toy = sparse("toy.gguf", 4 << 20)
    why = measure.toy_reasons(toy, [10 << 10], MACHINE)
    assert set(why) == {"reads", "compute"}
    compute = _stream({1: (2896.0,), 2: (2544.0,)})
    c = rules.choose(_cells("odirect", {1: 141, 2: 130}), "", compute, MACHINE, [10 << 10], 16384, leave=why)
    assert (c.read_path, c.io_threads, c.read_mb_s, c.threads) == (None, None, None, None)
    assert set(c.left) == {"read_path", "io_threads", "read_mb_s", "threads"} and c.cache_margin_mb == 112
    # real slices, but the file fits the 4 GiB limit 16 times: the compute figures only
    assert set(measure.toy_reasons(sparse("small.gguf", 200 << 20), [663552], MACHINE)) == {"compute"}
    assert measure.toy_reasons(sparse("big.gguf", 3 << 30), [663552], MACHINE) == {}


def test_user_profile_directory_is_searched_after_explicit_dirs_and_before_the_env(tmp_path: Path) -> None:
    xdg, release, extra = tmp_path / "xdg", tmp_path / "release", tmp_path / "extra"
    extra.mkdir()
    # a deployed release: the launcher exports BMOE_EDGE_BOARD and puts <release>/profile first in
    # $BMOE_EDGE_PROFILES, where the bundle's resolved profile of its board is (profile_file_text)
    (release / "profile").mkdir(parents=True)
    resolved = profiles.load_profile("rpi5")
    (release / "profile" / "rpi5.yaml").write_text(profiles.profile_file_text(replace(resolved, ram_mb=4096)))
    environ = {"XDG_CONFIG_HOME": str(xdg), "HOME": "/nonexistent", profiles.BOARD_ENV: "rpi5",
               profiles.PROFILES_ENV: str(release / "profile")}
    assert profiles.user_dir(environ) == xdg / "bmoe-edge" / "profiles"
    env_dir = (release / "profile").resolve()
    assert profiles.profile_dirs([extra], environ) == [extra, env_dir, profiles.shipped_dir()]  # missing: skipped
    (xdg / "bmoe-edge" / "profiles").mkdir(parents=True)
    user = (xdg / "bmoe-edge" / "profiles").resolve()
    assert profiles.profile_dirs([extra], environ) == [extra, user, env_dir, profiles.shipped_dir()]
    assert profiles.user_dir({"HOME": "/home/pi"}) == Path("/home/pi/.config/bmoe-edge/profiles")
    assert profiles.user_dir({}) is None
    # a tuned rpi5 in the user dir (what `tune --host` writes) layers on the release's resolved profile,
    # and the machine's profile (what `generate` with no --board loads on the board) is that one
    (user / "rpi5.yaml").write_text("extends: rpi5\nstorage: {read_mb_s: 420}\n"
                                    "engine: {io_threads: 3, threads: 2, read_path: pread, cache_margin_mb: 96}\n")
    p = profiles.load_profile(profiles.machine_board(environ), profiles.profile_dirs(environ=environ))
    assert p.source == (user / "rpi5.yaml") and p.storage.read_mb_s == 420
    assert {k: p.engine[k] for k in TUNED} == {"io_threads": 3, "threads": 2, "read_path": "pread",
                                               "cache_margin_mb": 96}
    assert (p.ram_mb, p.storage.kind) == (4096, resolved.storage.kind)     # from the release's profile
    assert p.engine["cache_mb"] == resolved.engine["cache_mb"]               # engine: merges key by key


# ---------------------------------------------------------------------------------------------------
# Bad input: one line, nothing written.


@pytest.mark.parametrize("args, needle", [
    (["-m", "/nonexistent/model.gguf"], "cannot read /nonexistent/model.gguf"),
    (["--dir", "/proc/no-such-dir"], "cannot write a scratch file in /proc/no-such-dir"),
    (["--host", "root@127.0.0.1:{port}"], "cannot reach"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str], needle: str) -> None:
    with emulated_board.socket.socket() as s:     # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_cli("tune", "--quick", *(a.format(port=port) for a in args), env=_env(tmp_path), timeout=120)
    assert_clean_error(result, needle)
    assert not (tmp_path / "config").exists()


@pytest.mark.parametrize("kwargs, needle", [
    ({"model": Path("/etc")}, "cannot read /etc: Is a directory"),
    ({"model": "{notgguf}"}, "not a gguf file"),
    ({"out": "{tmp}/profile.txt"}, "ends in .yaml"),
    ({"out": "/proc/no/x.yaml"}, "cannot write /proc/no/x.yaml"),
    ({"board": "nosuchboard"}, "unknown board profile 'nosuchboard'"),
])
def test_more_bad_input_fails_before_measuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict,
                                               needle: str) -> None:
    (tmp_path / "notgguf").write_text("hello\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    args = {k: Path(str(v).format(notgguf=tmp_path / "notgguf", tmp=tmp_path)) if k != "board" else v
            for k, v in kwargs.items()}
    lines: list[str] = []
    with pytest.raises(BmoeError, match=needle) as err:
        local.tune_local(quick=True, scratch_dir=tmp_path, progress=lines.append, **args)
    assert "\n" not in str(err.value) and not lines     # one line, before anything was measured
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notgguf"]
    with pytest.raises(BmoeError, match="expected USER@HOST"):
        fleet_targets.parse_target("root@bad host")


def test_a_board_with_nothing_deployed_is_an_error(tmp_path: Path) -> None:
    empty_lab = tmp_path / "lab"
    b = emulated_board.start(empty_lab, "empty")
    try:
        result = run_cli("tune", "--quick", "--host", b.target, "--install-dir", str(b.install_dir),
                         env=_env(tmp_path, BMOE_EDGE_SSH_CONFIG=str(empty_lab / "ssh_config")), timeout=60)
    finally:
        emulated_board.stop(empty_lab, "empty")
    assert_clean_error(result, b.target, "nothing is deployed")
    assert not (tmp_path / "config").exists() and not (b.home / ".config" / "bmoe-edge" / "profiles").exists()


# ---------------------------------------------------------------------------------------------------
# The emulated board: the deployed bundle measures the board, the profile comes back and stays there.


# The session's lab and main board (conftest.py; the deploy tests deployed there first) and its qemu-arm64 bundle.
bundle_a = test_deploy.bundle_a


@pytest.fixture(scope="module")
def deployed_plain(board: emulated_board.EmulatedBoard, bundle_a: Path, lab: Path) -> emulated_board.EmulatedBoard:
    """bundle A deployed without gates (tune needs a release, not its gate verdict); after the deploy
    tests, a redeploy."""
    env = dict(os.environ, BMOE_EDGE_SSH_CONFIG=str(lab / "ssh_config"))
    result = run_cli("deploy", "--board", "qemu-arm64", "--dist", str(bundle_a.parent), "--host", board.target,
                     "--install-dir", str(board.install_dir), env=env, timeout=1200)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    return board


@pytest.mark.slow
@pytest.mark.emulated
def test_tune_host_measures_the_board_and_writes_the_profile_here_and_there(
        deployed_plain: emulated_board.EmulatedBoard, lab: Path, tmp_path: Path) -> None:
    b = deployed_plain
    env = _env(tmp_path, BMOE_EDGE_SSH_CONFIG=str(lab / "ssh_config"))
    started = time.monotonic()
    result = run_cli("tune", "--host", b.target, "--quick", "--json", env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"\ntune --host (emulated board, quick): {time.monotonic() - started:.1f} s")
    report = json.loads(result.stdout)
    assert report["board"] == "qemu-arm64" and report["where"] == b.target
    assert report["machine"]["arch"] == "aarch64"       # measured by the board's own (emulated) Python
    assert {c["mode"] for c in report["io"]} == {"odirect", "pread"}
    # threads: never from the bundle's tiny fixture. The emulated board's file system is this machine's, so
    # the benchmark-shaped model this machine's tune wrote is in its cache and is measured (emulated); a
    # board without it (its release cannot write one) measures no compute and leaves threads alone
    assert Path(report["fixture"]).name != "tiny-qwen3moe-Q8_0.gguf"
    if report["compute"]:
        assert Path(report["fixture"]).name == BENCH_SHAPED
        _assert_threads_not_below_the_best(report)
    else:
        assert report["fixture"] == "" and report["choice"]["threads"] is None
        assert "-m MODEL" in report["choice"]["left"]["threads"]
        assert any("threads left alone" in w for w in report["warnings"])
    # written here, in the local user profile directory ...
    local = tmp_path / "config" / "bmoe-edge" / "profiles" / "qemu-arm64.yaml"
    board_file = b.home / ".config" / "bmoe-edge" / "profiles" / "qemu-arm64.yaml"
    assert report["written"] == [str(local), f"{b.target}:{board_file}"]
    mine = profiles.load_profile("qemu-arm64", profiles.profile_dirs(environ=env))
    assert mine.source == local.resolve() and mine.exec_wrapper is not None
    _assert_matches(mine, report["choice"], profiles.load_profile("qemu-arm64", [profiles.shipped_dir()]))
    assert ("threads" in yaml.safe_load(local.read_text())["engine"]) == (report["choice"]["threads"] is not None)
    # ... and on the board, where its launcher resolves it on top of the release's own profile: `tune` run
    # there by hand (no --board: the deployed release's board) starts from the tuned values
    assert board_file.read_text() == local.read_text()
    with commands.Board(fleet_targets.parse_target(b.target), remote.SshOptions(ssh_config=lab / "ssh_config")) as conn:
        again = conn.sh('exec "$@"', f"{b.install_dir}/bin/bmoe-edge", "tune", "--quick", "--no-write", "--json",
                        what="tune on the board", timeout=600)
        # `generate` with no --board there runs with the tuned engine settings (the machine's profile)
        fixture = f"{b.install_dir}/current/fixtures/tiny-qwen3moe-Q8_0.gguf"
        gen = conn.sh('exec "$@"', f"{b.install_dir}/bin/bmoe-edge", "generate", "-m", fixture, "-p", "Once",
                      "-n", "1", "--json", what="generate", timeout=600)
    on_board = json.loads(again.stdout)
    assert on_board["board"] == "qemu-arm64" and on_board["written"] == []
    for key in TUNED:
        if report["choice"][key] is not None:
            assert on_board["before"][key] == report["choice"][key], key
    assert on_board["before"]["read_mb_s"] == report["choice"]["read_mb_s"]
    run = json.loads(gen.stdout.splitlines()[0])
    assert run["type"] == "run" and run["io_threads"] == report["choice"]["io_threads"]
    assert run["read_path_requested"] == report["choice"]["read_path"]


@pytest.mark.slow
@pytest.mark.emulated
def test_tune_host_with_a_model_the_board_cannot_read_writes_nothing(
        deployed_plain: emulated_board.EmulatedBoard, lab: Path, tmp_path: Path) -> None:
    b = deployed_plain
    env = _env(tmp_path, BMOE_EDGE_SSH_CONFIG=str(lab / "ssh_config"))
    before = sorted((b.home / ".config").rglob("*"))
    result = run_cli("tune", "--host", b.target, "--quick", "-m", "/nonexistent/model.gguf", env=env, timeout=600)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == result.stderr.strip().splitlines()[-1], result.stderr
    assert b.target in errors[0] and "cannot read /nonexistent/model.gguf" in errors[0]
    assert not (tmp_path / "config").exists() and sorted((b.home / ".config").rglob("*")) == before
