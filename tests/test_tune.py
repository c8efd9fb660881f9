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
from bmoe_edge.bench import tune as measure
from bmoe_edge.boards import profiles, tune
from bmoe_edge.engine import memlimits
from bmoe_edge.errors import BmoeError
from bmoe_edge.fixtures import tinymoe
from bmoe_edge.fleet import emulated_board, remote

import test_deploy
from conftest import assert_clean_error, run_cli

TUNED = ("io_threads", "threads", "read_path", "cache_margin_mb")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (profiles.PROFILES_ENV, profiles.BOARD_ENV)}
    return dict(env, XDG_CONFIG_HOME=str(tmp_path / "config"), **extra)


def _assert_matches(profile: profiles.BoardProfile, choice: dict) -> None:
    for key in TUNED:
        assert profile.engine[key] == choice[key], key
    assert profile.storage.read_mb_s == choice["read_mb_s"]


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
    assert [c["threads"] for c in report["compute"]] == list(range(1, cores + 1))
    assert all(c["tok_s"] > 0 for c in report["compute"])
    facts = report["machine"]
    assert facts["page_size"] == os.sysconf("SC_PAGE_SIZE") and facts["cores"] == cores
    assert facts["ram_mb"] == machine.mem_info()["MemTotal"] // 2**20
    assert not list(scratch.iterdir())    # the scratch file is gone
    # what it chose follows the rules from what it measured
    choice = report["choice"]
    io = [measure.IoCell(**c) for c in report["io"]]
    curve = tune.lane_curve(io, choice["read_path"])
    assert choice["io_threads"] == min(n for n, v in curve.items() if v >= 0.95 * max(curve.values()))
    assert choice["threads"] == max(report["compute"], key=lambda c: c["tok_s"])["threads"]
    # the profile: in the user profile directory, `extends: host`, resolved by the loader with the values
    written = tmp_path / "config" / "bmoe-edge" / "profiles" / "host.yaml"
    assert report["written"] == [str(written)]
    own = yaml.safe_load(written.read_text())
    assert own["extends"] == "host" and set(own) >= {"storage", "engine"} and set(own["engine"]) == set(TUNED)
    assert set(own["storage"]) == {"read_mb_s"}
    dirs = profiles.profile_dirs(environ=env)
    assert dirs[0] == written.parent.resolve()
    host = profiles.load_profile("host", dirs)
    assert host.source == written.resolve()
    _assert_matches(host, choice)
    shipped = profiles.load_profile("host", [profiles.shipped_dir()])
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
                   "compute, resident decode tok/s", "threads", "chosen", "read_path", "io_threads",
                   "storage.read_mb_s", "engine.cache_margin_mb", f"wrote {out}"):
        assert needle in text, (needle, text)
    print("\n" + text)
    # the --out file is a profile named after the file, extending host, with the table's values
    p = profiles.load_profile_file(out, [profiles.shipped_dir()])
    assert (p.name, p.source) == ("bench-box", out.resolve())
    cols = [re.split(r"\s{2,}", row.strip()) for row in text.split("\nchosen\n")[1].splitlines()[1:] if row.strip()]
    now = {c[0].rpartition(".")[2]: c[2] for c in cols if c[0].startswith(("engine.", "storage."))}
    assert now == {**{key: str(p.engine[key]) for key in TUNED}, "read_mb_s": str(p.storage.read_mb_s)}
    assert not (tmp_path / "config").exists()   # --out: the user directory is untouched


def test_a_model_is_read_at_its_slice_sizes_and_the_cgroup_limit_is_found(tmp_path: Path) -> None:
    """-m: its slice sizes, and (it fits) compute on it; run inside a memory cgroup with a 3 GiB limit,
    which is reported and sizes the margin."""
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    slices = sorted({t.expert_bytes for t in layout.gguf_layout(model).experts})
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
    assert report["read_file"] == str(model) and report["fixture"] == str(model)   # it fits: compute on it
    assert report["written"] == [] and not (tmp_path / "config").exists()
    if cap.method != "none":
        limits = report["machine"]["limits"]
        assert any(lim["mb"] == 3072 and "cgroup" in lim["source"] for lim in limits), limits
        choice = report["choice"]
        assert choice["cache_margin_mb"] == tune.cache_margin(choice["read_path"], choice["io_threads"],
                                                              report["sizes"], 3072)


# ---------------------------------------------------------------------------------------------------
# The rules and the search order (plain functions).


def _cells(mode: str, by_lanes: dict[int, float]) -> list[measure.IoCell]:
    return [measure.IoCell(mode, 648 << 10, n, v, 100) for n, v in by_lanes.items()]


MACHINE = measure.Machine("b", "aarch64", 4, 8064, 7000, 16384,
                          (memlimits.MemoryLimit("cgroup v2 /x memory.max", 4096),), None)


def test_choice_rules() -> None:
    compute = [measure.ComputeCell(n, v) for n, v in ((1, 5.0), (2, 9.0), (3, 9.0), (4, 8.0))]
    odirect = _cells("odirect", {1: 300, 2: 560, 3: 590, 4: 600, 5: 598})
    c = tune.choose([*odirect, *_cells("pread", {1: 250, 2: 640, 3: 650})], "", compute, MACHINE, [648 << 10], 4096)
    # pread is faster, but not by more than 10%: O_DIRECT; 3 lanes are within 5% of the best (600)
    assert (c.read_path, c.io_threads, c.read_mb_s) == ("odirect", 3, round(590 * 2**20 / 1e6))
    assert c.threads == 2                                   # the best tok/s; the fewer threads on a tie
    assert c.cache_margin_mb == 112                         # 64 + 1% of the 4096 MiB limit, up to 16 MiB
    assert c.page_size == 16384                             # the kernel's differs from the profile's
    c = tune.choose([*odirect, *_cells("pread", {1: 400, 2: 700})], "", compute, MACHINE, [648 << 10], 16384)
    assert (c.read_path, c.io_threads, c.page_size) == ("pread", 2, None)    # 700 > 1.1 x 600
    assert c.cache_margin_mb == 112 and tune.cache_margin("pread", 8, [8 << 20], 4096) == 240   # + 2*8*8 MiB
    c = tune.choose(_cells("pread", {1: 100, 2: 101}), "O_DIRECT open failed: Invalid argument", compute,
                    MACHINE, [648 << 10], 16384)
    assert (c.read_path, c.io_threads) == ("pread", 1) and "Invalid argument" in c.why["read_path"]
    assert MACHINE.effective_mb == 4096


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
        tune.tune_local(quick=True, scratch_dir=tmp_path, progress=lines.append, **args)
    assert "\n" not in str(err.value) and not lines     # one line, before anything was measured
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notgguf"]
    with pytest.raises(BmoeError, match="expected USER@HOST"):
        remote.parse_target("root@bad host")


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
    assert {c["mode"] for c in report["io"]} == {"odirect", "pread"} and report["compute"]
    assert Path(report["fixture"]).name == "tiny-qwen3moe-Q8_0.gguf"   # the bundle's fixture
    # written here, in the local user profile directory ...
    local = tmp_path / "config" / "bmoe-edge" / "profiles" / "qemu-arm64.yaml"
    board_file = b.home / ".config" / "bmoe-edge" / "profiles" / "qemu-arm64.yaml"
    assert report["written"] == [str(local), f"{b.target}:{board_file}"]
    mine = profiles.load_profile("qemu-arm64", profiles.profile_dirs(environ=env))
    assert mine.source == local.resolve() and mine.exec_wrapper is not None
    _assert_matches(mine, report["choice"])
    # ... and on the board, where its launcher resolves it on top of the release's own profile: `tune` run
    # there by hand (no --board: the deployed release's board) starts from the tuned values
    assert board_file.read_text() == local.read_text()
    with remote.Board(remote.parse_target(b.target), remote.SshOptions(ssh_config=lab / "ssh_config")) as conn:
        again = conn.sh('exec "$@"', f"{b.install_dir}/bin/bmoe-edge", "tune", "--quick", "--no-write", "--json",
                        what="tune on the board", timeout=600)
        # `generate` with no --board there runs with the tuned engine settings (the machine's profile)
        fixture = f"{b.install_dir}/current/fixtures/tiny-qwen3moe-Q8_0.gguf"
        gen = conn.sh('exec "$@"', f"{b.install_dir}/bin/bmoe-edge", "generate", "-m", fixture, "-p", "Once",
                      "-n", "1", "--json", what="generate", timeout=600)
    on_board = json.loads(again.stdout)
    assert on_board["board"] == "qemu-arm64" and on_board["written"] == []
    for key in TUNED:
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
