"""Several machines, one model: llama.cpp RPC workers (real rpc-server processes on loopback) hold
whole layers, this process streams the experts of the rest. Output equals a resident run here;
workers that fail, lie or do not fit give one line naming them."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from bmoe_edge.engine import Engine, rpc, rpc_worker
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof import gates
from bmoe_edge.synthetic import tinymoe

from conftest import assert_clean_error, run_cli


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[rpc_worker.LocalWorker]]:
    with rpc_worker.local_workers(2, log_dir=tmp_path_factory.mktemp("rpc-logs")) as ws:
        yield ws


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_gate_cells_rpc_equal_resident(workers: list[rpc_worker.LocalWorker]) -> None:
    """Every quick fixture (five architectures, a split file among them): ids and every step's float32
    logits byte-identical to the resident run, with a third of the layers streamed here."""
    cells = gates.rpc_matrix(rpc_worker.endpoints(workers))
    results = list(gates.run_gates(cells, gates.fixture_resolver(None), gates.QUICK_STEPS))
    assert len(results) == len(gates.QUICK_FIXTURES)
    for r in results:
        assert r.passed and r.equal_tokens and r.equal_logits and r.bytes_read > 0, gates.format_result(r)


@pytest.mark.parametrize("split,main_layers", [("1,1,1", 2), ("0,1,1", 1), ("2,1,1", 2), ("3,0,1", 3)])
def test_placement_follows_the_split(model: Path, workers: list[rpc_worker.LocalWorker], split: str,
                                     main_layers: int) -> None:
    """Whole layers, in order; the main process keeps one layer at least while streaming (0,1,1); the
    run info says where each lives, and streams only the experts of its own layers."""
    endpoints = rpc_worker.endpoints(workers)
    config = replace(gates.BASE, cache_mb=0.1, rpc=endpoints, rpc_split=split)
    with Engine(model, config) as engine:
        info = engine.run_info
        tokens = engine.run(gates.PROMPTS[0], 4).tokens
    assert info["main_layers"] == main_layers and info["rpc_workers"] == 2
    assert str(info["placement"]).startswith(f"main 0{'-' + str(main_layers - 1) if main_layers > 1 else ''} "
                                             "(streamed)")
    assert str(info["placement"]).endswith("+ output")
    per_layer = 3  # qwen3moe: gate, up, down
    assert info["streamed_tensors"] == main_layers * per_layer
    with Engine(model, replace(gates.BASE, stream=False)) as engine:
        assert engine.run(gates.PROMPTS[0], 4).tokens == tokens


def test_generate_progress_shows_the_layers(model: Path, workers: list[rpc_worker.LocalWorker]) -> None:
    result = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "4", "-t", "1", "--progress",
                     "--rpc", rpc_worker.endpoints(workers), "--rpc-split", "2,1,1")
    assert result.returncode == 0, result.stderr
    a, b = (str(w.endpoint) for w in workers)
    assert f"layers: main 0-1 (streamed); {a} 2; {b} 3 + output" in result.stderr
    assert re.search(r"^RPC network: [\d.]+ MiB, [\d.]+ KiB/token$", result.stderr, re.M), result.stderr


def test_network_bytes_per_token(model: Path, workers: list[rpc_worker.LocalWorker]) -> None:
    """TCP_INFO of the worker sockets: every decode step moves at least the logits back from the worker
    holding the output layer (n_vocab float32s); a run without workers counts nothing."""
    config = replace(gates.BASE, rpc=rpc_worker.endpoints(workers), rpc_split="1,1,1")
    with Engine(model, config) as engine:
        n_vocab = len(engine.run(gates.PROMPTS[0], 1, logits=True).logits[0]) // 4
        steps = engine.run(gates.PROMPTS[0], 4).metrics
    assert all(m.net_bytes > 4 * n_vocab for m in steps)
    with Engine(model, replace(gates.BASE)) as engine:
        assert all(m.net_bytes == 0 for m in engine.run(gates.PROMPTS[0], 2).metrics)


def test_worker_killed_mid_run_one_line_then_a_restart_works(model: Path, tmp_path: Path) -> None:
    with rpc_worker.local_workers(2, log_dir=tmp_path) as ws:
        args = [sys.executable, "-m", "bmoe_edge", "generate", "-m", str(model), "-p", "Once upon a time",
                "-n", "1800", "-c", "2048", "-t", "1", "--json", "--rpc", rpc_worker.endpoints(ws)]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:  # wait for the decode to be under way
            if json.loads(line)["type"] == "token":
                break
        ws[1].proc.send_signal(signal.SIGKILL)
        ws[1].proc.wait()
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 30
        assert proc.returncode == 1
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: RPC worker {ws[1].endpoint} stopped answering"), err
        # the same worker started again: the next run succeeds
        ws[1] = rpc_worker.start_worker(ws[1].endpoint.port, log_dir=tmp_path)
        rpc_worker.wait_ready(ws[1])
        result = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "8", "-t", "1", "--json",
                         "--rpc", rpc_worker.endpoints(ws))
        assert result.returncode == 0, result.stderr


def test_a_stopped_worker_hits_the_deadline(model: Path, tmp_path: Path) -> None:
    """SIGSTOP: the socket stays open and ggml-rpc would wait forever; the decode deadline ends it."""
    with rpc_worker.local_workers(2, log_dir=tmp_path) as ws:
        args = [sys.executable, "-m", "bmoe_edge", "generate", "-m", str(model), "-p", "Once upon a time",
                "-n", "1800", "-c", "2048", "-t", "1", "--json", "--rpc-timeout", "3",
                "--rpc", rpc_worker.endpoints(ws)]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if json.loads(line)["type"] == "token":
                break
        ws[0].proc.send_signal(signal.SIGSTOP)
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            ws[0].proc.send_signal(signal.SIGCONT)
        assert proc.returncode == 1
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and "waited 3 s for the RPC workers" in lines[0], err


def test_unreachable_worker(model: Path) -> None:
    port = free_port()
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "x", "--rpc", f"127.0.0.1:{port}"),
                       f"RPC worker 127.0.0.1:{port} refused the connection", "rpc-worker --port")


def test_non_loopback_worker_needs_insecure(model: Path) -> None:
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "x", "--rpc", "192.0.2.7:50052"),
                       "--rpc 192.0.2.7:50052", "no authentication", "--rpc-insecure")


@pytest.mark.parametrize("value,needle", [("127.0.0.1", "not HOST:PORT"), ("127.0.0.1:0", "not HOST:PORT"),
                                          ("127.0.0.1:5,127.0.0.1:5", "listed twice")])
def test_bad_endpoints(model: Path, value: str, needle: str) -> None:
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "x", "--rpc", value), needle)


class OtherVersionServer:
    """A peer answering HELLO as an rpc-server of protocol 6.1.0 (an older llama.cpp) would."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(1 + 8 + 24)
                conn.sendall(struct.pack("<Q", 28) + bytes([6, 1, 0, 0]) + bytes(24))


def test_worker_of_another_version(model: Path) -> None:
    server = OtherVersionServer()
    try:
        assert_clean_error(run_cli("generate", "-m", str(model), "-p", "x", "--rpc", f"127.0.0.1:{server.port}"),
                           f"RPC worker 127.0.0.1:{server.port} speaks RPC protocol 6.1.0", "same bmoe-edge release")
    finally:
        server.sock.close()


def test_a_split_bigger_than_a_worker(model: Path, tmp_path: Path) -> None:
    """A worker started with --mem-mb 32 reports 32 MiB: a share of layers plus the KV/buffer reserve
    does not fit, and the error names it (before the weights load)."""
    with rpc_worker.local_workers(1, mem_mb=32, log_dir=tmp_path) as ws:
        result = run_cli("generate", "-m", str(model), "-p", "x", "--rpc", rpc_worker.endpoints(ws),
                         "--rpc-split", "1,1")
    assert_clean_error(result, f"RPC worker {ws[0].endpoint}: the split puts 2 layer(s) and the output layer",
                       "32 MiB free", "--rpc-split")


def test_split_needs_one_weight_per_participant(model: Path, workers: list[rpc_worker.LocalWorker]) -> None:
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "x", "--rpc", rpc_worker.endpoints(workers),
                               "--rpc-split", "1,1"), "--rpc-split needs 3 weights")


def test_probe_reports_memory_and_version(tmp_path: Path) -> None:
    protocol = rpc_worker.native.load().build_info().rpc_protocol
    with rpc_worker.local_workers(1, mem_mb=100, log_dir=tmp_path) as ws:
        worker = rpc.probe(ws[0].endpoint, protocol)
    assert worker.protocol == protocol and worker.devices == 1
    assert worker.free_bytes == worker.total_bytes == 100 << 20


def test_rpc_worker_refuses_a_public_bind() -> None:
    assert_clean_error(run_cli("rpc-worker", "--bind", "0.0.0.0", "--port", str(free_port())),
                       "--bind 0.0.0.0", "no authentication", "--insecure-bind")


def test_rpc_worker_serves_and_warns_when_exposed() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bmoe_edge", "rpc-worker", "--port", str(port), "--bind",
                             "0.0.0.0", "--insecure-bind", "--mem-mb", "64"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        worker = rpc_worker.LocalWorker(rpc.Endpoint("127.0.0.1", port), proc)
        rpc_worker.wait_ready(worker)
        info = rpc.probe(worker.endpoint, rpc_worker.native.load().build_info().rpc_protocol)
        assert info.free_bytes == 64 << 20
    finally:
        rpc_worker.stop_worker(worker)
    assert proc.stderr is not None
    assert "warning: the RPC protocol has no authentication or encryption" in proc.stderr.read()


@pytest.mark.parametrize("mem_args,note", [
    ((), "reporting 96 MiB, the memory limit of cgroup"),
    (("--mem-mb", "4000"), "--mem-mb 4000 is more than this process may hold (96 MiB"),
])
def test_rpc_worker_reports_its_memory_limit(mem_args: tuple[str, ...], note: str) -> None:
    """Under a memory cgroup (a service's MemoryMax, here a real cgroup of 96 MiB) the worker reports the
    limit, not the machine's RAM: a main board must never place more on it than it may hold."""
    from bmoe_edge.bench import ramcap

    try:
        cap = ramcap.make_cap(96 << 20)
        cap.prepare()
    except (BmoeError, OSError) as exc:
        pytest.skip(f"no memory cgroup to run in: {exc}")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bmoe_edge", "rpc-worker", "--port", str(port), *mem_args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=cap.preexec)
    worker = rpc_worker.LocalWorker(rpc.Endpoint("127.0.0.1", port), proc)
    try:
        rpc_worker.wait_ready(worker)
        info = rpc.probe(worker.endpoint, rpc_worker.native.load().build_info().rpc_protocol)
        assert info.free_bytes == info.total_bytes == 96 << 20
    finally:
        rpc_worker.stop_worker(worker)
        cap.finish()
    assert proc.stderr is not None
    assert note in proc.stderr.read()


def test_an_inventory_without_workers_is_one_line(model: Path, tmp_path: Path) -> None:
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text("hosts: [pi@kitchen.local]\n")
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "x", "--inventory", str(inventory)),
                       f"inventory {inventory} has no host with `role: rpc-worker`")
    inventory.write_text("hosts: [{host: pi@kitchen.local, role: worker}]\n")
    assert_clean_error(run_cli("generate", "-m", str(model), "-p", "x", "--inventory", str(inventory)),
                       "role 'worker' is not one of rpc-worker")


def test_probe_rejects_a_silent_peer() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        endpoint = rpc.Endpoint("127.0.0.1", silent.getsockname()[1])
        with pytest.raises(BmoeError, match="did not answer within 1 s"):
            rpc.probe(endpoint, "7.0.0", timeout=1.0)


@pytest.mark.parametrize("reached_by", ["rpc-host", "inventory"])
def test_workers_through_ssh_tunnels(model: Path, tmp_path: Path, reached_by: str) -> None:
    """--rpc-host, or a fleet inventory's `role: rpc-worker` board: the worker listens on loopback only;
    the main side reaches it through the emulated board's real sshd (fabric's local forwarding), no
    --rpc-insecure needed."""
    from bmoe_edge.fleet import emulated_board

    lab = tmp_path / "lab"
    board = emulated_board.start(lab, "rpc")
    try:
        with rpc_worker.local_workers(1, log_dir=tmp_path) as ws:
            if reached_by == "rpc-host":
                workers = ["--rpc-host", board.target, "--rpc-port", str(ws[0].endpoint.port)]
            else:
                inventory = tmp_path / "fleet.yaml"
                inventory.write_text(yaml.safe_dump({"hosts": [
                    {"host": board.target, "board": "qemu-arm64"},     # a main board: not a worker
                    {"host": board.target, "role": "rpc-worker", "rpc_port": ws[0].endpoint.port}]}))
                workers = ["--inventory", str(inventory)]
            result = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "8", "-t", "1", "--json",
                             "--progress", *workers, "--rpc-split", "1,1",
                             env={**os.environ, "BMOE_EDGE_SSH_CONFIG": str(board.ssh_config)})
        assert result.returncode == 0, result.stderr
        assert "(SSH tunnel)" in result.stderr
        records = [json.loads(line) for line in result.stdout.splitlines()]
        assert records[0]["type"] == "run" and records[0]["placement"].startswith("main 0-1 (streamed); 127.0.0.1:")
        tunneled = [r["id"] for r in records if r["type"] == "token"]
        resident = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "8", "-t", "1", "--json",
                           "--no-stream")
        assert tunneled == [r["id"] for r in map(json.loads, resident.stdout.splitlines()) if r["type"] == "token"]
    finally:
        emulated_board.stop(lab, "rpc")


def test_a_server_with_workers_through_ssh_tunnels(model: Path, tmp_path: Path) -> None:
    """`serve --rpc-host`: the same tunnels as generate's; greedy completions equal the resident run."""
    from http import client as http_client

    from bmoe_edge.fleet import emulated_board

    lab = tmp_path / "lab"
    board = emulated_board.start(lab, "rpc-serve")
    port = rpc_worker.free_port()
    try:
        with rpc_worker.local_workers(1, log_dir=tmp_path) as ws:
            server = subprocess.Popen(
                [sys.executable, "-m", "bmoe_edge", "serve", "-m", str(model), "--port", str(port), "-t", "1",
                 "--rpc-host", board.target, "--rpc-port", str(ws[0].endpoint.port), "--rpc-split", "1,1"],
                env={**os.environ, "BMOE_EDGE_SSH_CONFIG": str(board.ssh_config)}, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, text=True)
            try:
                deadline = time.monotonic() + 120
                while True:
                    assert server.poll() is None, server.stderr.read()[-2000:]
                    try:
                        conn = http_client.HTTPConnection("127.0.0.1", port, timeout=120)
                        conn.request("POST", "/v1/completions", json.dumps(
                            {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}),
                            {"Content-Type": "application/json"})
                        reply = json.loads(conn.getresponse().read())
                        break
                    except ConnectionRefusedError:
                        assert time.monotonic() < deadline, "the server did not come up"
                        time.sleep(0.5)
            finally:
                server.terminate()
                stderr = server.communicate(timeout=60)[1]
        assert "(SSH tunnel)" in stderr
        resident = run_cli("generate", "-m", str(model), "-p", "Once upon a time", "-n", "8", "-t", "1", "--json",
                           "--no-stream")
        text = "".join(r["text"] for r in map(json.loads, resident.stdout.splitlines()) if r["type"] == "token")
        assert reply["choices"][0]["text"] == text
    finally:
        emulated_board.stop(lab, "rpc-serve")
    assert_clean_error(run_cli("serve", "-m", str(model), "--rpc-host", "pi@board", "--host", "pi@board"),
                       "--rpc-host and --inventory are for a run on this machine")


def test_bench_rpc_cells_run_small(model: Path, tmp_path: Path) -> None:
    """The bench cells' code path on the tiny model, uncapped (the campaign itself needs a quiet machine):
    0 and 1 worker, a record each, network bytes only with the worker."""
    from bmoe_edge.bench import rpc_cells
    from bmoe_edge.bench.cells import BenchCell

    cell = BenchCell("stream", "stream", config={"threads": 1, "cache_mb": 0.2, "ctx": 256}, capped=False, tokens=4)
    records = rpc_cells.run_rpc_cells(cell, model, 0, [0, 1], tmp_path, timeout=300)
    assert [r["workers"] for r in records] == [0, 1]
    assert all(r["status"] == "ok" and r["decode_tokens"] == 3 for r in records), records
    assert records[0]["net_bytes_per_token"] == 0 < records[1]["net_bytes_per_token"]
    assert records[1]["run"]["rpc_workers"] == 1 and records[1]["label"] == "stream+rpc1"


def test_a_server_whose_worker_dies_answers_503_says_so_in_health_and_exits_1(model: Path, tmp_path: Path) -> None:
    """A worker lost mid-answer (ggml-rpc cannot return the error: the process must end): the streamed
    answer ends with a 503 error naming the worker, /health says 503 with it, and the server exits 1 with
    one line, so the service manager starts a new one."""
    from http import client as http_client

    port = rpc_worker.free_port()
    with rpc_worker.local_workers(2, log_dir=tmp_path) as ws:
        server = subprocess.Popen(
            [sys.executable, "-m", "bmoe_edge", "serve", "-m", str(model), "--port", str(port), "-t", "1",
             "-c", "2048", "--rpc", rpc_worker.endpoints(ws)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        try:
            deadline = time.monotonic() + 120
            while True:
                assert server.poll() is None, server.stderr.read()[-2000:] if server.stderr else ""
                try:
                    conn = http_client.HTTPConnection("127.0.0.1", port, timeout=60)
                    conn.request("POST", "/v1/completions", json.dumps(
                        {"prompt": "Once upon a time", "max_tokens": 1800, "temperature": 0, "stream": True}),
                        {"Content-Type": "application/json"})
                    stream = conn.getresponse()
                    break
                except ConnectionRefusedError:
                    assert time.monotonic() < deadline, "the server did not come up"
                    time.sleep(0.3)
            assert stream.status == 200
            assert stream.readline().startswith(b"data: ")       # the answer is under way
            ws[1].proc.send_signal(signal.SIGKILL)
            ws[1].proc.wait()
            events = [line[6:] for line in stream.read().decode().splitlines() if line.startswith("data: ")]
            last = json.loads(events[-1])
            assert "error" in last and f"RPC worker {ws[1].endpoint} stopped answering" in last["error"]["message"]
            health = http_client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                health.request("GET", "/health")
                reply = health.getresponse()
                assert reply.status == 503 and "stopped answering" in json.loads(reply.read())["reason"]
            except ConnectionRefusedError:
                pass                       # already gone: the exit below is what a service manager sees
            t0 = time.monotonic()
            _, err = server.communicate(timeout=30)
            assert time.monotonic() - t0 < 10
        finally:
            if server.poll() is None:
                server.kill()
                server.communicate()
    assert server.returncode == 1
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(("serving ", "note: "))]
    assert len(lines) == 1 and lines[0].startswith(f"error: RPC worker {ws[1].endpoint} stopped answering"), err
