"""`bench stream|io|serve --host` (issue #48): the campaign runs on the emulated board (a real sshd in
front of the deployed qemu-arm64 bundle) through its release, detached; its files come back and look like a
local run's; a lost connection is one line and the same command picks the run up; the card made from the
fetched run names no host, user or path.
Named to sort after test_deploy.py: the board's tests run in one worker in file order, and the deploy tests'
first deploy must find the board empty (this file's deploys are redeploys)."""

from __future__ import annotations

import csv
import getpass
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bmoe_edge.cli import app
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import bench_run, emulated_board, remote
from bmoe_edge.fleet.targets import parse_target
from bmoe_edge.synthetic import tinymoe

from conftest import assert_clean_error, run_cli
from test_deploy import assert_one_error, bundle_a  # noqa: F401 - the session's qemu-arm64 bundle (a fixture)
from test_tune import deployed_plain  # noqa: F401 - the main board with bundle A deployed (a fixture)

TINY = "tiny-qwen3moe-Q8_0.gguf"
# The smallest campaign that still has every kind of output: an engine cell under the board's own profile, a
# fixed streamed cell, an io cell, one io sweep (io.csv), per-token rows (tokens.csv), summary, targets, plots.
CAMPAIGN = ["--ram-cap", "none", "--tokens", "2", "--repeats", "1", "--cells", "defaults,off-serial-od4,io-od1",
            "--io-seconds", "0.05", "--long-prompts", ""]


def _files(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}


def _csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def identifying(text: str, needles: list[str]) -> list[str]:
    """The needles (hostnames, users, paths, addresses) that occur in a card's text."""
    return [n for n in needles if n and n in text]


# ---------------------------------------------------------------------------------------------------
# Fast: what is passed on to the board, and the failures before a board is reached.


def test_only_the_options_given_are_passed_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The board's own profile applies: a default of this machine is never forwarded, and the options that say
    where the run happens (--host, --out, the SSH ones) stay here; -m goes as the board's path, verbatim."""
    calls: list[tuple] = []

    def fake(target, command, model, args, out, **kw):
        calls.append((target.host, command, model, list(args), out, kw["install_dir"]))
        return bench_run.BoardRun(0 if command == ["io"] else 3, "measured\n")   # 3: the board's exit code

    monkeypatch.setattr(bench_run, "run_bench", fake)
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "io", "-m", "models/x y.gguf", "--host", "pi@board", "--seconds", "0.5",
                                 "--install-dir", "/opt/b", "--ssh-config", str(tmp_path / "cfg")])
    assert result.exit_code == 0, result.output
    assert calls[-1] == ("board", ["io"], ["models/x y.gguf"], ["--seconds", "0.5"], None, "/opt/b")
    assert result.stdout == "measured\n"
    result = runner.invoke(app, ["bench", "stream", "--host", "pi@board", "-m", "/m/a.gguf", "--ram-cap", "none",
                                 "--cells", "defaults", "--out", str(tmp_path / "o"), "--long-prompts", "",
                                 "--accept-new-host-key"])
    assert result.exit_code == 3 and result.stdout == "", result.output
    assert calls[-1][:4] == ("board", ["stream"], ["/m/a.gguf"],
                             ["--ram-cap", "none", "--cells", "defaults", "--long-prompts", ""])
    assert calls[-1][4] == tmp_path / "o"
    # bench serve: every -m goes, in order, as a board path
    result = runner.invoke(app, ["bench", "serve", "--host", "pi@board", "-m", "/m/a.gguf", "-m", "/m/b c.gguf",
                                 "--ram-cap", "none", "--clients", "2", "--out", str(tmp_path / "s")])
    assert result.exit_code == 3 and result.stdout == "", result.output
    assert calls[-1][:4] == ("board", ["serve"], ["/m/a.gguf", "/m/b c.gguf"],
                             ["--ram-cap", "none", "--clients", "2"])


def test_ram_cap_none_is_no_cap() -> None:
    """A board whose memory is smaller than the model needs no cgroup (nor root): `--ram-cap none`."""
    from bmoe_edge.bench import ramcap

    assert ramcap.parse_cap("none", 10 << 30) == 0 and ramcap.parse_cap("40%", 1000) == 400
    assert type(ramcap.make_cap(0, "cgroup-v2")).__name__ == "NoCap"


def test_an_unreachable_board_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:     # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_cli("bench", "stream", "--host", f"root@127.0.0.1:{port}", "-m", "/m.gguf", "--ram-cap", "none",
                     "--out", str(tmp_path / "out"), timeout=60)
    assert_clean_error(result, f"root@127.0.0.1:{port}: cannot reach")
    assert not (tmp_path / "out").exists()


def test_a_card_check_has_teeth() -> None:
    """The identifying check below finds what is planted in a card."""
    card = {"machine": {"cpu": "Cortex-A76"}, "model": {"name": "/home/pi/models/m.gguf"}}
    assert identifying(json.dumps(card), ["/home/pi/models", "raspberrypi"]) == ["/home/pi/models"]


# ---------------------------------------------------------------------------------------------------
# Slow: the emulated board.


class _DropsTheConnection:
    """A progress sink that closes the SSH connection at the first line the board sends (a dropped link)."""

    def __init__(self, watch: remote.Watch) -> None:
        self.watch, self.lines = watch, []

    def write(self, text: str) -> int:
        self.lines.append(text)
        self.watch.expire()
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.slow
@pytest.mark.emulated
def test_bench_stream_host_looks_like_a_local_run_survives_a_lost_connection_and_makes_a_clean_card(
        deployed_plain: emulated_board.EmulatedBoard, lab: Path, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    b = deployed_plain
    env = dict(os.environ, BMOE_EDGE_SSH_CONFIG=str(lab / "ssh_config"))
    monkeypatch.setenv("BMOE_EDGE_SSH_CONFIG", str(lab / "ssh_config"))
    board_model = f"{b.install_dir}/current/fixtures/{TINY}"
    here, there = tmp_path / "here", tmp_path / "there"

    local = run_cli("bench", "stream", "-m", str(tinymoe.fixture("qwen3moe", "Q8_0")), *CAMPAIGN, "--out", str(here),
                    env=env, timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]

    # The campaign starts on the board; the link drops at its first progress line: one line saying how to
    # pick it up, and the local --out remembers the run ...
    args = CAMPAIGN[:]
    sink = _DropsTheConnection(remote.Watch())
    with remote.watched(sink.watch), pytest.raises(BmoeError) as lost:
        bench_run.run_bench(parse_target(b.target), ["stream"], [board_model], args, there,
                            options=remote.SshOptions(), install_dir=str(b.install_dir), progress=sink)
    message = str(lost.value)
    assert "\n" not in message and "the connection was lost" in message, message
    assert f"run the same command again with --out {there}" in message
    assert sink.lines and (there / bench_run.RUN_MARKER).is_file() and not (there / "cells.csv").exists()

    # ... which the same command follows to its end (the progress streams as it comes) and fetches
    again = run_cli("bench", "stream", "--host", b.target, "--install-dir", str(b.install_dir), "-m", board_model,
                    *CAMPAIGN, "--out", str(there), env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "following the run already started on the board" in again.stderr
    for label in ("defaults", "off-serial-od4", "io-od1"):
        assert f"[0] {label} " in again.stderr, again.stderr
    assert again.stdout == (there / "summary.md").read_text()
    assert not (there / bench_run.RUN_MARKER).exists()
    assert not list((b.home / ".cache" / "bmoe-edge" / "bench").iterdir())   # the board keeps no copy

    # The same files as the local run (plots drawn here from the fetched CSVs), the same columns and cells
    assert _files(there) == _files(here), (_files(here) ^ _files(there))
    assert {"cells.csv", "tokens.csv", "io.csv", "run.json", "summary.md", "targets.json", "tokps.png"} <= _files(here)
    for name in sorted(n for n in _files(here) if n.endswith(".csv")):
        assert _csv(there / name)[0] == _csv(here / name)[0], name
    rows_here, rows_there = _csv(here / "cells.csv")[1], _csv(there / "cells.csv")[1]
    assert sorted(r["label"] for r in rows_there) == sorted(r["label"] for r in rows_here)
    assert {r["status"] for r in rows_there} == {"ok"}, rows_there
    run = json.loads((there / "run.json").read_text())
    assert run["machine"]["machine"] == "aarch64" and run["model"] == board_model   # measured on the board

    # The card of the fetched run: board, storage, model, cells; nothing that names the host, user or a path
    report = run_cli("bench", "report", str(there), env=env, timeout=120)
    assert report.returncode == 0, report.stderr
    card = json.loads((there / "card.json").read_text())
    assert card["machine"]["arch"] == "aarch64" and card["storage"]["measured"]
    assert {c["label"] for c in card["cells"]} == {"defaults", "off-serial-od4", "io-od1"}
    needles = [b.target, f"127.0.0.1:{b.port}", "127.0.0.1", "root", getpass.getuser(), b.user, str(b.install_dir),
               str(Path(board_model).parent), str(b.home), "/tmp", str(tmp_path), socket.gethostname(),
               run["machine"]["hostname"], "/home", "/root", "/opt", "/work"]
    for text in ((there / "card.md").read_text(), (there / "card.json").read_text(), report.stdout):
        assert identifying(text, needles) == [], text

    # bench io --host: the board's drive, its io.csv and io.md back here, its table printed
    io_out = tmp_path / "io"
    io = run_cli("bench", "io", "--host", b.target, "--install-dir", str(b.install_dir), "-m", board_model,
                 "--sizes", "4k", "--lanes", "1", "--modes", "pread", "--seconds", "0.05", "--out", str(io_out),
                 env=env, timeout=600)
    assert io.returncode == 0, io.stderr[-3000:]
    assert _files(io_out) == {"io.csv", "io.md"} and "pread" in io.stdout


# The smallest serve campaign: one cell, one client, a few tokens, no cap (a board needs no root for it).
SERVE_CAMPAIGN = ["--ram-cap", "none", "--clients", "1", "--tokens", "3", "--long-prompt", "0", "--repeats", "1",
                  "--ctx", "512"]


@pytest.mark.slow
@pytest.mark.emulated
def test_bench_serve_host_runs_the_real_server_on_the_board_and_looks_like_a_local_run(
        deployed_plain: emulated_board.EmulatedBoard, lab: Path, tmp_path: Path) -> None:  # noqa: F811
    """Its servers are the board's own `serve` (through the emulated board's exec wrapper), its clients stream
    from them there; cells.csv, clients.csv, summary.md and the servers' logs come back as a local run's."""
    b = deployed_plain
    env = dict(os.environ, BMOE_EDGE_SSH_CONFIG=str(lab / "ssh_config"))
    board_model = f"{b.install_dir}/current/fixtures/{TINY}"
    here, there = tmp_path / "here", tmp_path / "there"
    local = run_cli("bench", "serve", "-m", str(tinymoe.fixture("qwen3moe", "Q8_0")), *SERVE_CAMPAIGN, "--out",
                    str(here), env=env, timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]
    assert "r0 p1-c1: " in local.stderr and local.stdout == (here / "summary.md").read_text()
    board = run_cli("bench", "serve", "--host", b.target, "--install-dir", str(b.install_dir), "-m", board_model,
                    *SERVE_CAMPAIGN, "--out", str(there), env=env, timeout=900)
    assert board.returncode == 0, board.stderr[-3000:]
    assert "r0 p1-c1: " in board.stderr and board.stdout == (there / "summary.md").read_text()
    def outputs(model_stem: str) -> set[str]:
        return {"cells.csv", "clients.csv", "summary.md", f"servers/{model_stem}-r0-p1-c1.log"}

    assert _files(here) == outputs(tinymoe.fixture("qwen3moe", "Q8_0").stem), _files(here)
    assert _files(there) == outputs(Path(TINY).stem), _files(there)
    for name in ("cells.csv", "clients.csv"):
        assert _csv(there / name)[0] == _csv(here / name)[0], name
    (cell,), (client,) = _csv(there / "cells.csv")[1], _csv(there / "clients.csv")[1]
    assert float(cell["aggregate_tok_s"]) > 0 and int(client["tokens"]) == 3, (cell, client)
    assert cell["model"] == Path(TINY).stem   # the board's file (this machine's fixture has another name)
    log = (there / "servers" / f"{Path(TINY).stem}-r0-p1-c1.log").read_text()
    assert f"serving {TINY} on http://127.0.0.1:" in log and "leaked" not in log, log[-2000:]   # stopped clean
    assert not (there / bench_run.RUN_MARKER).exists()


@pytest.mark.slow
@pytest.mark.emulated
def test_a_model_missing_on_the_board_and_a_wrong_install_dir_are_one_line(
        deployed_plain: emulated_board.EmulatedBoard, lab: Path, tmp_path: Path) -> None:  # noqa: F811
    b = deployed_plain
    env = dict(os.environ, BMOE_EDGE_SSH_CONFIG=str(lab / "ssh_config"))
    out = tmp_path / "out"
    result = run_cli("bench", "stream", "--host", b.target, "--install-dir", str(b.install_dir), "-m",
                     "/nonexistent/m.gguf", *CAMPAIGN, "--out", str(out), env=env, timeout=120)
    assert_clean_error(result, b.target, "/nonexistent/m.gguf: no such readable file on the board")
    assert not out.exists()
    result = run_cli("bench", "stream", "--host", b.target, "--install-dir", str(tmp_path / "nothing-here"), "-m",
                     "/nonexistent/m.gguf", *CAMPAIGN, "--out", str(out), env=env, timeout=120)
    assert_one_error(result, b.target, "nothing is deployed")
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.emulated
def test_bench_kernels_on_the_board_runs_the_anchor_its_release_carries(
        deployed_plain: emulated_board.EmulatedBoard, lab: Path) -> None:  # noqa: F811
    """A board's release has no llama.cpp source to build the pin's llama-bench from: `bench kernels`, run on the
    board as its user runs it (bin/bmoe-edge, over SSH), pairs the engine with the llama-bench the board's build
    put beside the native module (aarch64, the board's flags), both sides measured."""
    b = deployed_plain
    out = b.home / "kernels"
    command = (f"{b.install_dir}/bin/bmoe-edge bench kernels -m {b.install_dir}/current/fixtures/{TINY} "
               "--thread-counts 1 --repack-settings auto --repeats 1 --decode-runs 1 --tokens 2 --prompt-tokens 0 "
               f"--flash-attn-settings off --out {out}")
    result = subprocess.run(["ssh", "-F", str(lab / "ssh_config"), "-p", str(b.port), f"{b.user}@127.0.0.1",
                             command], capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "building the pin's llama-bench" not in result.stdout + result.stderr   # the release's own, not built
    (row,) = _csv(out / "kernels.csv")[1]
    assert row["model"] == TINY and float(row["decode_tok_s"]) > 0 and float(row["llama_bench_decode_tok_s"]) > 0
    assert f"| {TINY} | 1 |" in result.stdout
