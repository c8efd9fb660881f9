"""Deploy over SSH with real parts: a real OpenSSH sshd on 127.0.0.1 (bmoe_edge.fleet.emulated_board) in front
of the qemu-arm64 board, a real cross-built bundle, the CLI run as a user would (a separate process).

Fast tests (no bundle): targets, inventories, the board checks, unit rendering, host keys and SSH errors.
Slow ones: the chain build -> deploy --gates -> status -> generate -> changed bundle -> rollback, a
fleet with failing hosts, tampering, killed deploys, hostile prompts and paths, the systemd unit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bmoe_edge import llama_source
from bmoe_edge.boards import build, bundle, emulate, signing
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import deploy, emulated_board, onboard, probe, remote, services, systemd
from bmoe_edge.fleet import state as board_state
from bmoe_edge.fleet import targets as fleet_targets
from bmoe_edge.proof import gates

from conftest import run_cli

QWEN3 = "fixtures/tiny-qwen3moe-Q8_0.gguf"


def _env(lab: Path, **extra: str) -> dict[str, str]:
    return dict(os.environ, BMOE_EDGE_SSH_CONFIG=str(lab / "ssh_config"), **extra)


def assert_one_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Failed with exactly one `error:` line (the last one on stderr; progress lines may precede it)."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def _token_ids(stdout: str) -> list[int]:
    return [r["id"] for r in map(json.loads, stdout.splitlines()) if r.get("type") == "token"]


def _summary(stdout: str) -> dict:
    return next(r for r in map(json.loads, stdout.splitlines()) if r.get("type") == "summary")


def _host(result: subprocess.CompletedProcess[str]) -> dict:
    report = json.loads(result.stdout)
    assert len(report["hosts"]) == 1, report
    return report["hosts"][0]


# ---------------------------------------------------------------------------------------------------
# Fast: no bundle, no qemu.


@pytest.mark.parametrize("spec, want", [
    ("pi@raspberrypi.local", ("raspberrypi.local", "pi", None)),
    ("pi@10.0.0.5:2222", ("10.0.0.5", "pi", 2222)),
    ("board7", ("board7", None, None)),
    ("root@[::1]:22", ("::1", "root", 22)),
    ("fe80::1", ("fe80::1", None, None)),
])
def test_targets_parse(spec: str, want: tuple) -> None:
    t = fleet_targets.parse_target(spec)
    assert (t.host, t.user, t.port) == want


@pytest.mark.parametrize("spec, needle", [
    ("pi@host:99999", "port"), ("pi@host:x", "port"), ("@host", "user"), ("pi@", "USER@HOST"),
    ("pi@ho st", "USER@HOST"), ("pi@$(reboot)", "USER@HOST"),
])
def test_bad_targets_are_clean_errors(spec: str, needle: str) -> None:
    with pytest.raises(BmoeError, match="host") as err:
        fleet_targets.parse_target(spec)
    assert needle in str(err.value)


def test_inventory_gives_boards_users_ports_and_install_dirs(tmp_path: Path) -> None:
    inv = tmp_path / "fleet.yaml"
    inv.write_text("defaults: {board: rpi5, user: pi}\n"
                   "hosts:\n"
                   "  - kitchen.local\n"
                   "  - {host: alice@10.0.0.7:2222, board: rpi4, install_dir: /opt/bmoe-edge}\n"
                   "  - {host: 10.0.0.8, port: 2200}\n")
    targets = fleet_targets.load_inventory(inv)
    assert [(t.host, t.user, t.port, t.board, t.install_dir) for t in targets] == [
        ("kitchen.local", "pi", None, "rpi5", None),
        ("10.0.0.7", "alice", 2222, "rpi4", "/opt/bmoe-edge"),
        ("10.0.0.8", "pi", 2200, "rpi5", None)]
    inv.write_text("hosts:\n  - {host: a, prot: 22}\n")
    with pytest.raises(BmoeError, match=r"hosts\[0\]: unknown key 'prot'"):
        fleet_targets.load_inventory(inv)
    inv.write_text("hosts:\n  - {host: a, install_dir: relative/dir}\n")
    with pytest.raises(BmoeError, match="must be an absolute path"):
        fleet_targets.load_inventory(inv)


def test_inventory_roles_make_rpc_workers(tmp_path: Path) -> None:
    """`role: rpc-worker` boards run the RPC worker service whatever --service asked for the others (at
    their `rpc_port`); a typo in the role or an rpc_port without it is one line."""
    inv = tmp_path / "fleet.yaml"
    inv.write_text("defaults: {board: rpi5, user: pi}\n"
                   "hosts:\n"
                   "  - pi-a.local\n"
                   "  - {host: pi-b.local, role: rpc-worker}\n"
                   "  - {host: pi-c.local, role: rpc-worker, rpc_port: 50060}\n")
    main, plain_worker, worker = fleet_targets.load_inventory(inv)
    assert (main.role, plain_worker.role, worker.role, worker.rpc_port) == (None, "rpc-worker", "rpc-worker", 50060)
    serve = services.spec_for("serve", model="/m.gguf", bind="127.0.0.1", port=None, api_key=None)
    assert services.for_target(main, serve) is serve and services.for_target(main, None) is None
    for asked in (serve, None):
        spec = services.for_target(worker, asked)
        assert spec is not None and spec.kind.name == "rpc-worker" and spec.listen_port == 50060
    assert services.for_target(plain_worker, None).listen_port == 50052  # type: ignore[union-attr]
    asked = services.spec_for("rpc-worker", model=None, bind="127.0.0.1", port=50070, api_key=None)
    assert services.for_target(plain_worker, asked).listen_port == 50070  # type: ignore[union-attr]
    for text, needle in (("{host: a, role: worker}", "role 'worker' is not one of rpc-worker"),
                         ("{host: a, rpc_port: 50052}", "rpc_port goes with role: rpc-worker"),
                         ("{host: a, role: rpc-worker, rpc_port: 0}", "rpc_port 0 is not a number from 1 to 65535")):
        inv.write_text(f"hosts:\n  - {text}\n")
        with pytest.raises(BmoeError, match=re.escape(needle)):
            fleet_targets.load_inventory(inv)


def _manifest_like(**changes: object) -> bundle.Manifest:
    base = dict(format_version=1, bundle_id="rpi5-0.1.0-abcdefabcdef", board="rpi5", arch="aarch64", profile={},
                python="3.11", glibc_required="2.34", needed_libs=(), llama=bundle.LlamaPin("v", "s", "c", ()),
                compilers={}, cmake_flags={}, bmoe_edge_version="0.1.0", wheel="wheels/w.whl",
                dependency_wheels=(), launcher="launcher/bmoe-edge.sh", fixtures=(), files=())
    base.update(changes)
    return bundle.Manifest(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("facts, needle", [
    (probe.BoardFacts("x86_64", "x86_64", "3.11.2", "2.36", False, "uname -m"), "the board is x86_64 (uname -m)"),
    (probe.BoardFacts("aarch64", "armv7l", "3.11.2", "2.36", False, "platform.machine()"), "is armv7l"),
    (probe.BoardFacts("aarch64", "aarch64", "3.10.12", "2.36", False, "uname -m"), "Python is 3.10.12"),
    (probe.BoardFacts("aarch64", "aarch64", "3.11.2", "2.31", False, "uname -m"), "needs glibc >= 2.34"),
])
def test_board_checks_refuse_a_mismatch_in_one_line(facts: probe.BoardFacts, needle: str) -> None:
    with pytest.raises(BmoeError) as err:
        probe.check_facts(facts, _manifest_like(), "pi@pi5:22")
    assert needle in str(err.value) and "\n" not in str(err.value)
    probe.check_facts(probe.BoardFacts("aarch64", "aarch64", "3.11.2", "2.36", False, "uname -m"),
                       _manifest_like(), "pi@pi5:22")


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "wheels/../../x", "a//b", ""])
def test_remote_paths_cannot_escape_the_release(path: str) -> None:
    layout = board_state.Layout("/home/pi/bmoe-edge")
    with pytest.raises(BmoeError, match="not a plain relative path"):
        board_state.inside(layout.partial("rpi5-0.1.0-abcdefabcdef"), path)
    for bad_id in ("../etc", "a/b", ".hidden", ""):
        with pytest.raises(BmoeError, match="not a plain name"):
            layout.release(bad_id)
    with pytest.raises(BmoeError, match="absolute path"):
        board_state.Layout("relative/dir")


def test_unit_rendering_escapes_the_install_dir() -> None:
    template = build.DEPLOY_DIR / "bmoe-edge-generate@.service"
    text = systemd.render_job_unit(template.read_text(), "/opt/my 100% \"odd\" $dir", "pi")
    exec_start = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    assert exec_start == ('ExecStart="/opt/my 100%% \\"odd\\" $$dir/current/launcher/bmoe-edge-job.sh" '
                          '"/opt/my 100%% \\"odd\\" $$dir/jobs/%i"')
    assert "User=pi" in text and "@INSTALL_DIR@" not in text
    with pytest.raises(BmoeError):
        systemd.render_job_unit(template.read_text(), "/opt/a\nb", "pi")


def _unit_fields(text: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln and not ln.startswith("#"))


def test_service_unit_is_hardened_and_its_words_escaped() -> None:
    spec = services.spec_for("serve", model="/m/my 100% $model.gguf", bind="127.0.0.1", port=8181, api_key="k")
    layout = board_state.Layout("/opt/bmoe edge")
    fields = _unit_fields(services.render_unit(spec, layout, "pi", "rpi5", ram_mb=8192))
    assert fields["Type"] == "exec" and fields["Restart"] == "on-failure" and fields["User"] == "pi"
    assert fields["MemoryMax"] == "7168M" and fields["NoNewPrivileges"] == "yes" and fields["ProtectSystem"] == "strict"
    assert fields["ReadOnlyPaths"] == '"/m/my 100%% $$model.gguf"'
    assert fields["ReadWritePaths"] == '"/opt/bmoe edge/services/serve"'
    assert fields["WorkingDirectory"] == "/opt/bmoe edge/services/serve"     # a bare path there (no quoting)
    with pytest.raises(BmoeError, match="cannot be a service's directory"):
        services.render_unit(spec, board_state.Layout('/opt/a"b'), "pi", "rpi5", ram_mb=8192)
    argv = shlex.split(fields["ExecStart"].replace("%%", "%").replace("$$", "$"))
    assert argv == ["/opt/bmoe edge/bin/bmoe-edge", "serve", "--board", "rpi5", "-m", "/m/my 100% $model.gguf",
                    "--bind", "127.0.0.1", "--port", "8181", "--api-key-file", "/opt/bmoe edge/services/serve/api-key"]
    assert not re.search(r"@[A-Z_]+@", "".join(fields.values()))   # placeholders filled (@system-service: a filter)


def test_rpc_worker_service_is_one_row_loopback_and_without_a_model() -> None:
    spec = services.spec_for("rpc-worker", model=None, bind="127.0.0.1", port=None, api_key=None)
    layout = board_state.Layout("/opt/bmoe")
    fields = _unit_fields(services.render_unit(spec, layout, "pi", "rpi5", ram_mb=8192))
    argv = shlex.split(fields["ExecStart"])
    assert argv == ["/opt/bmoe/bin/bmoe-edge", "rpc-worker", "--board", "rpi5", "--bind", "127.0.0.1", "--port",
                    "50052"]
    assert fields["ReadOnlyPaths"] == '"/opt/bmoe"' and fields["NoNewPrivileges"] == "yes"
    with pytest.raises(BmoeError, match="takes no API key"):
        services.spec_for("rpc-worker", model=None, bind="127.0.0.1", port=None, api_key="k")


@pytest.mark.parametrize("name, model, needle", [
    ("serve", None, "needs -m MODEL"),
    ("serve", "model.gguf", "absolute path"),
    ("rpc", "/m.gguf", "unknown service 'rpc': one of serve"),
])
def test_bad_service_requests_are_one_line(name: str, model: str | None, needle: str) -> None:
    with pytest.raises(BmoeError, match=needle):
        services.spec_for(name, model=model, bind="127.0.0.1", port=None, api_key=None)


def test_a_serve_service_beyond_loopback_needs_a_key_or_no_auth_said_out_loud() -> None:
    with pytest.raises(BmoeError, match="needs an API key"):
        services.spec_for("serve", model="/m.gguf", bind="0.0.0.0", port=None, api_key=None)
    open_one = services.spec_for("serve", model="/m.gguf", bind="0.0.0.0", port=None, api_key=None, no_auth=True)
    layout = board_state.Layout("/opt/bmoe")
    assert "--no-auth" in services.exec_argv(open_one, layout, "rpi5")
    keyed = services.spec_for("serve", model="/m.gguf", bind="0.0.0.0", port=None, api_key="k")
    assert "--no-auth" not in services.exec_argv(keyed, layout, "rpi5")
    for bad in ({"api_key": "k"}, {"name": "rpc-worker", "model": None}):
        with pytest.raises(BmoeError, match="--no-auth goes with --service serve"):
            services.spec_for(**{"name": "serve", "model": "/m.gguf", "bind": "127.0.0.1", "port": None,
                                 "api_key": None, "no_auth": True, **bad})


def test_generate_options_pass_through_only_when_given() -> None:
    args = onboard.generate_args(max_tokens=8, as_json=True, progress=True,
                                csv_path=None, overrides={"stream": False, "cache_mb": "auto", "threads": None,
                                                          "overlap": True, "read_path": None, "temp": 1.0,
                                                          "top_k": None, "seed": 3})
    assert args == ["-n", "8", "--no-stream", "--cache-mb", "auto", "--overlap", "--temp", "1.0", "--seed", "3",
                    "--json", "--progress"]


@pytest.fixture()
def quick_lab(tmp_path: Path):
    lab = tmp_path / "lab"
    started: list[str] = []

    def start(name: str, **kwargs) -> emulated_board.EmulatedBoard:
        started.append(name)
        return emulated_board.start(lab, name, **kwargs)

    yield lab, start
    for name in started:
        emulated_board.stop(lab, name)


def test_unknown_host_key_is_refused_with_the_command_to_accept_it(quick_lab) -> None:
    lab, start = quick_lab
    board = start("stranger", known=False)
    env = _env(lab)
    result = run_cli("status", "--host", board.target, env=env, timeout=60)
    line = assert_one_error(result, "unknown host key", "ssh-ed25519",
                            f"ssh-keyscan -p {board.port} 127.0.0.1 >> {shlex.quote(str(board.known_hosts))}",
                            "--accept-new-host-key")
    assert "SHA256:" in line
    assert f"[127.0.0.1]:{board.port}" not in board.known_hosts.read_text()
    # the opt-in records it (accept-new): the connection works (nothing is deployed there yet) ...
    result = run_cli("status", "--host", board.target, "--accept-new-host-key", env=env, timeout=60)
    assert_one_error(result, "no deploy found there")
    assert f"[127.0.0.1]:{board.port} ssh-ed25519 " in board.known_hosts.read_text()
    # ... and from then on it is a known host without the flag
    assert_one_error(run_cli("status", "--host", board.target, env=env, timeout=60), "no deploy found there")
    # a CHANGED key is refused even with the flag
    emulated_board.stop(lab, "stranger")
    for suffix in ("", ".pub"):
        (board.dir / f"ssh_host_ed25519_key{suffix}").unlink()
    start("stranger", port=board.port, known=False)
    result = run_cli("status", "--host", board.target, "--accept-new-host-key", env=env, timeout=60)
    assert_one_error(result, "host key CHANGED", "ssh-keygen -R")


def test_ssh_failures_are_one_line_errors(quick_lab, tmp_path: Path) -> None:
    lab, start = quick_lab
    board = start("auth")
    # a key the board does not know
    stranger = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host 127.0.0.1\n  IdentityFile {stranger}\n  UserKnownHostsFile {board.known_hosts}\n")
    result = run_cli("status", "--host", board.target, "--ssh-config", str(config), env=dict(os.environ),
                     timeout=60)
    assert_one_error(result, "authentication failed", board.target)
    # nobody listening
    with emulated_board.socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_cli("deploy", "--bundle", str(tmp_path), "--host", f"root@127.0.0.1:{port}", env=_env(lab))
    assert_one_error(result, "no bundle")   # the bundle is checked before any host is touched
    result = run_cli("status", "--host", f"root@127.0.0.1:{port}", env=_env(lab), timeout=60)
    assert_one_error(result, f"root@127.0.0.1:{port}: cannot reach")


# ---------------------------------------------------------------------------------------------------
# Slow: a real bundle on the emulated board.


# `lab` and `board` (the main emulated board), like the bundles, are the session's: conftest.py.


@pytest.fixture(scope="session")
def bundle_a(qemu_bundle: Path) -> Path:
    """`bmoe-edge build --board qemu-arm64`: the session's one build (conftest.qemu_bundle)."""
    return qemu_bundle


def changed_bundle(src: Path, dest: Path, marker: str) -> Path:
    """A copy of a bundle whose launcher exports one more variable: a new bundle id, one changed file."""
    shutil.copytree(src, dest)
    launcher = dest / bundle.LAUNCHER_SCRIPT
    launcher.write_text(launcher.read_text().replace("set -eu\n", f"set -eu\nexport BMOE_EDGE_VARIANT={marker}\n", 1))
    m = bundle.load_manifest(src)
    bundle.write_manifest(dest, board=m.board, arch=m.arch, profile=m.profile, python=m.python,
                          glibc_required=m.glibc_required, needed_libs=m.needed_libs, llama=m.llama,
                          compilers=m.compilers, cmake_flags=m.cmake_flags, bmoe_edge_version=m.bmoe_edge_version,
                          wheel=m.wheel, dependency_wheels=m.dependency_wheels, launcher=m.launcher,
                          fixtures=m.fixtures, extra=m.extra)
    signing.sign_bundle(dest)     # the builder signs it (the tests' builder key, under their XDG_CONFIG_HOME)
    return dest


@pytest.fixture(scope="module")
def deployed(board: emulated_board.EmulatedBoard, bundle_a: Path, lab: Path) -> dict:
    """bundle A deployed with --gates to the main board (its install dir), through the CLI."""
    started = time.monotonic()
    result = run_cli("deploy", "--board", "qemu-arm64", "--dist", str(bundle_a.parent), "--host", board.target,
                     "--install-dir", str(board.install_dir), "--gates", "--json", env=_env(lab), timeout=1200)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    host = _host(result)
    host["wall_seconds"] = time.monotonic() - started
    return host


# The rollback, tamper, kill and fleet tests below prove the fleet's logic, which is the same on every
# board: they deploy the host bundle, which the board runs natively (under qemu every Python start costs
# ~3 s). The aarch64 path has the tests above: `deployed` (deploy --gates), generate, serve, the units.
@pytest.fixture(scope="module")
def host_a(board_bundle) -> Path:
    """`bmoe-edge build --board host`, the session's one build of it."""
    return board_bundle("host")


@pytest.fixture(scope="module")
def host_b(host_a: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return changed_bundle(host_a, tmp_path_factory.mktemp("hb") / host_a.name, "b")


@pytest.fixture(scope="module")
def host_board(lab: Path):
    """A second emulated board for the host bundle: a board is one machine with one default release
    (`generate --host`, `status` without --install-dir use it), so the main board keeps qemu-arm64's."""
    b = emulated_board.start(lab, "host-board")
    yield b
    emulated_board.stop(lab, "host-board")


@pytest.fixture(scope="module")
def host_deployed(host_board: emulated_board.EmulatedBoard, host_a: Path, lab: Path) -> Path:
    """The host bundle A deployed with --gates to the host board; its install dir."""
    inst = host_board.install_dir
    result = run_cli("deploy", "--bundle", str(host_a), "--host", host_board.target, "--install-dir", str(inst),
                     "--gates", "--json", env=_env(lab), timeout=1200)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    return inst


def _release_ok(install_dir: Path, bundle_dir: Path) -> str:
    """`current` points at a complete release whose every file matches bundle_dir's manifest; its id."""
    current = install_dir / "current"
    assert current.is_symlink(), f"{current} is not a symlink"
    rel = install_dir / os.readlink(current)
    assert (rel / board_state.STAMP).is_file() and (rel / "site" / "bmoe_edge" / "__init__.py").is_file()
    m = bundle.load_manifest(rel)
    for f in m.files:
        assert hashlib.sha256((rel / f.path).read_bytes()).hexdigest() == f.sha256, f.path
    assert (rel / bundle.MANIFEST_NAME).read_bytes() == (bundle_dir / bundle.MANIFEST_NAME).read_bytes()
    return m.bundle_id


def _tree_with(release: Path, install_dir: Path) -> Path:
    """An install dir whose current is a copy of an installed release (a board with A on it)."""
    (install_dir / "releases").mkdir(parents=True)
    shutil.copytree(release, install_dir / "releases" / release.name, symlinks=True)
    (install_dir / "current").symlink_to(f"releases/{release.name}")
    return install_dir


@pytest.mark.slow
@pytest.mark.emulated
def test_deploy_with_gates_installs_verifies_and_switches(deployed: dict, board, bundle_a: Path, lab: Path) -> None:
    m = bundle.load_manifest(bundle_a)
    assert deployed["ok"] and deployed["action"] == "deployed" and deployed["bundle_id"] == m.bundle_id
    assert deployed["gates"]["failed"] == 0 and deployed["gates"]["passed"] == len(gates.quick_matrix())
    total = sum(f.size for f in m.files) + sum((bundle_a / n).stat().st_size for n in ("manifest.json",
                                                                                     signing.SIGNATURE_NAME))
    # every file, the manifest and its signature
    assert deployed["files_uploaded"] == len(m.files) + 2 and deployed["bytes_uploaded"] == total
    inst = board.install_dir
    assert _release_ok(inst, bundle_a) == m.bundle_id
    assert os.readlink(inst / "current") == f"releases/{m.bundle_id}"
    assert (inst / "releases" / m.bundle_id / "profile" / "qemu-arm64.yaml").is_file()
    state = json.loads((inst / "state.json").read_text())
    assert state["bundle_id"] == m.bundle_id and state["board"] == "qemu-arm64" and state["gates"]["failed"] == 0
    assert os.access(inst / "bin" / "bmoe-edge", os.X_OK) and (inst / "systemd" / board_state.UNIT_NAME).is_file()
    pointer = json.loads((board.home / ".config" / "bmoe-edge" / "deploy.json").read_text())
    assert pointer["install_dir"] == str(inst)
    # status, found through the pointer file (no --install-dir): current, bundle, board, when, gates
    result = run_cli("status", "--host", board.target, env=_env(lab), timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"current:     releases/{m.bundle_id}" in result.stdout and "board:       qemu-arm64" in result.stdout
    assert f"gates:       {deployed['gates']['passed']} passed, 0 failed (quick)" in result.stdout
    status = _host(run_cli("status", "--host", board.target, "--json", env=_env(lab), timeout=60))
    assert status["bundle_id"] == m.bundle_id and status["deployed_at"] == state["deployed_at"]
    print(f"\nfirst deploy with gates: {deployed['wall_seconds']:.1f} s")


@pytest.mark.slow
@pytest.mark.emulated
def test_remote_generate_streams_the_resident_ids_back(deployed: dict, board, lab: Path) -> None:
    model = str(board.install_dir / "current" / QWEN3)
    base = ["generate", "--host", board.target, "-m", model, "-p", "The quick brown fox", "-n", "8", "--json"]
    streamed = run_cli(*base, "--progress", env=_env(lab), timeout=600)
    resident = run_cli(*base, "--no-stream", env=_env(lab), timeout=600)
    assert streamed.returncode == 0 and resident.returncode == 0, streamed.stderr + resident.stderr
    ids = _token_ids(streamed.stdout)
    assert len(ids) == 8 and ids == _token_ids(resident.stdout)
    run = json.loads(streamed.stdout.splitlines()[0])
    # the board profile's defaults, taken from the deployed release: streaming, its lanes, threads auto
    # (the emulated board has the host's cores; one is left to the read lanes while streaming)
    assert run["streaming"] is True and run["io_threads"] == 1 and run["threads"] == max(1, (os.cpu_count() or 1) - 1)
    assert _summary(streamed.stdout)["bytes_read"] > 0
    assert sum(ln.startswith("[step") for ln in streamed.stderr.splitlines()) == 8   # --progress, remotely
    # text mode: the tokens, then the telemetry summary on stderr
    text = run_cli("generate", "--host", board.target, "-m", model, "-p", "The quick brown fox", "-n", "4",
                   env=_env(lab), timeout=600)
    assert text.returncode == 0 and text.stdout.strip() and "tok/s decode" in text.stderr, text.stderr
    # sampling reaches the board by name: the same seed repeats its tokens there, another seed does not
    # (hot and unfiltered: the fixture's next token has a wide margin by design)
    hot = [*base, "--temp", "2.0", "--top-p", "1", "--min-p", "0", "--seed"]
    sampled = [run_cli(*hot, seed, env=_env(lab), timeout=600) for seed in ("1", "1", "2")]
    assert all(r.returncode == 0 for r in sampled), [r.stderr for r in sampled]
    one, again, two = (_token_ids(r.stdout) for r in sampled)
    assert one == again and one != two and one != ids


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.emulated
def test_serve_on_the_board_through_a_forwarded_port_two_clients_at_once(deployed: dict, board, lab: Path) -> None:
    import openai

    model = str(board.install_dir / "current" / QWEN3)
    port, local = _free_port(), _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bmoe_edge", "serve", "--host", board.target, "-m", model, "--port", str(port),
         "--local-port", str(local), "--api-key", "board-key", "--ctx", "512", "--parallel", "2"],
        env=_env(lab), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        deadline = time.monotonic() + 600
        seen = ""
        while "serving" not in seen:
            line = server.stderr.readline()
            assert line or server.poll() is None, seen
            assert time.monotonic() < deadline, seen
            seen += line
        threading.Thread(target=server.stderr.read, daemon=True).start()
        assert f"127.0.0.1:{port}" in seen and "forwarding" in seen
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{local}/v1", api_key="board-key", max_retries=0,
                               timeout=300)
        reply = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=4, temperature=0,
                                               messages=[{"role": "user", "content": "The quick brown fox"}])
        assert reply.choices[0].message.content and reply.usage.completion_tokens == 4
        # --parallel 2 on the board: two clients at once, each its answer alone
        questions = ["The quick brown fox", "An old sailor said"]
        alone = [client.completions.create(model=reply.model, prompt=q, max_tokens=6, temperature=0).choices[0].text
                 for q in questions]
        together = [""] * 2

        def ask(i: int) -> None:
            together[i] = client.completions.create(model=reply.model, prompt=questions[i], max_tokens=6,
                                                    temperature=0).choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert together == alone and all(alone), (together, alone)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{local}/v1", api_key="wrong", max_retries=0).models.list()
    finally:
        server.terminate()
        server.wait(timeout=60)
    # The server on the board went with the connection.
    deadline = time.monotonic() + 60
    while subprocess.run(["pgrep", "-f", f"serve --board qemu-arm64 -m {model}"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the board's server outlived its connection"
        time.sleep(1)


@pytest.mark.slow
@pytest.mark.emulated
def test_no_change_redeploy_uploads_nothing(deployed: dict, board, bundle_a: Path, lab: Path) -> None:
    started = time.monotonic()
    result = run_cli("deploy", "--bundle", str(bundle_a), "--host", board.target, "--install-dir",
                     str(board.install_dir), "--json", env=_env(lab), timeout=600)
    assert result.returncode == 0, result.stderr
    host = _host(result)
    assert host["action"] == "redeployed" and host["files_uploaded"] == 0 and host["bytes_uploaded"] == 0
    assert host["files_present"] == host["files"] > 20
    assert time.monotonic() - started < 30


@pytest.mark.slow
@pytest.mark.emulated
def test_changed_bundle_moves_one_file_then_rollback(host_deployed: Path, host_board, host_a: Path, host_b: Path,
                                                     lab: Path) -> None:
    board = host_board
    bundle_a, bundle_b = host_a, host_b
    a, b = bundle.load_manifest(bundle_a), bundle.load_manifest(bundle_b)
    assert a.bundle_id != b.bundle_id
    inst = host_deployed
    result = run_cli("deploy", "--bundle", str(bundle_b), "--host", board.target, "--install-dir", str(inst),
                     "--json", env=_env(lab), timeout=900)
    assert result.returncode == 0, result.stderr
    host = _host(result)
    # the launcher, the manifest and its signature travel; everything else is copied from A on the board
    assert host["files_uploaded"] == 3 and host["bytes_uploaded"] < 64 * 1024
    assert host["files_copied"] == len(b.files) - 1
    assert host["previous"] == a.bundle_id and _release_ok(inst, bundle_b) == b.bundle_id
    assert "BMOE_EDGE_VARIANT=b" in (inst / "current" / bundle.LAUNCHER_SCRIPT).read_text()
    status = _host(run_cli("status", "--host", board.target, "--install-dir", str(inst), "--json", env=_env(lab),
                           timeout=60))
    assert status["bundle_id"] == b.bundle_id and status["previous"] == a.bundle_id
    # roll back: A again, atomically, after verifying it
    result = run_cli("rollback", "--host", board.target, "--install-dir", str(inst), env=_env(lab),
                     timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"rolled back to {a.bundle_id} (was {b.bundle_id})" in result.stdout
    assert _release_ok(inst, bundle_a) == a.bundle_id
    status = _host(run_cli("status", "--host", board.target, "--install-dir", str(inst), "--json", env=_env(lab),
                           timeout=60))
    assert status["bundle_id"] == a.bundle_id and status["previous"] == b.bundle_id
    assert status["gates"]["failed"] == 0   # A's gate result comes back with it
    # the board's own `bmoe-edge` runs the current release
    version = subprocess.run([str(inst / "bin" / "bmoe-edge"), "--version"], capture_output=True, text=True,
                             timeout=300, preexec_fn=emulate._no_core_dumps)
    assert version.returncode == 0 and "machine: x86_64" in version.stdout, version.stderr


@pytest.mark.slow
@pytest.mark.emulated
@pytest.mark.full_campaign   # the quick matrix under qemu again: `deployed` ran it on the board already
def test_remote_gates_bring_the_report_back(deployed: dict, board, lab: Path) -> None:
    result = run_cli("gates", "--host", board.target, "--json", env=_env(lab), timeout=1200)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["failed"] == 0 and report["passed"] == deployed["gates"]["passed"]
    assert {c["arch"] for c in report["cells"]} >= {"qwen3moe", "olmoe"}
    state = json.loads((board.install_dir / "state.json").read_text())
    assert state["gates"]["passed"] == report["passed"]


@pytest.mark.slow
@pytest.mark.emulated
def test_systemd_unit_renders_and_its_execstart_runs_a_job(deployed: dict, board, lab: Path) -> None:
    inst = board.install_dir
    unit = (inst / "systemd" / board_state.UNIT_NAME).read_text()
    fields = dict(ln.split("=", 1) for ln in unit.splitlines() if "=" in ln and not ln.startswith("#"))
    assert fields["User"] == "root" and fields["Type"] == "exec" and fields["WantedBy"] == "multi-user.target"
    assert fields["MemoryMax"].endswith("M") and fields["ProtectSystem"] == "strict"
    job = inst / "jobs" / "hello"
    job.mkdir(parents=True)
    prompt = "The quick brown fox\njumps over 'the' \"lazy\" $(dog)\n"
    (job / "model").write_text(str(inst / "current" / QWEN3) + "\n")
    (job / "prompt.txt").write_text(prompt)
    (job / "args").write_text("-n\n5\n")
    # what systemd would run: %i is the instance, %% a literal %, and the words are quoted
    line = fields["ExecStart"].replace("%i", "hello").replace("%%", "%")
    argv = shlex.split(line)
    assert argv[0] == str(inst / "current" / "launcher" / "bmoe-edge-job.sh")
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd="/", env={"PATH": os.environ["PATH"]},
                         preexec_fn=emulate._no_core_dumps)
    assert ran.returncode == 0, ran.stderr[-2000:]
    ids = _token_ids((job / "out.jsonl").read_text())
    assert len(ids) == 5 and (job / "telemetry.csv").read_text().count("\n") == 6
    remote_run = run_cli("generate", "--host", board.target, "-m", str(inst / "current" / QWEN3), "-p", prompt,
                         "-n", "5", "--json", env=_env(lab), timeout=600)
    assert _token_ids(remote_run.stdout) == ids


def _chat_page_through_a_forwarded_port(board, lab: Path, port: int, key: str) -> None:
    """The service's chat page as a user opens it from a laptop: `ssh -L` to the board's loopback port, then
    the page (and, where Chromium is, one question asked in it) at this machine's forwarded port."""
    import test_serve_ui
    from test_serve import http

    local = _free_port()
    tunnel = subprocess.Popen(["ssh", "-F", str(lab / "ssh_config"), "-p", str(board.port), "-N",
                               "-o", "ExitOnForwardFailure=yes", "-L", f"{local}:127.0.0.1:{port}",
                               f"{board.user}@127.0.0.1"], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{local}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                page = http(url, "GET", "/")
                break
            except OSError:
                assert tunnel.poll() is None and time.monotonic() < deadline, tunnel.stderr
                time.sleep(0.2)
        assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
        assert not re.search(r"https?://", page.text)
        # what the page's script sends: its own origin (this end of the tunnel) and the key as the bearer
        call = http(url, "POST", "/v1/chat/completions",
                    json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode(),
                    {"Content-Type": "application/json", "Origin": url, "Authorization": f"Bearer {key}"})
        assert call.status_code == 200 and call.json()["usage"]["completion_tokens"] == 2, call.text
        if isinstance(test_serve_ui._browser_paths(), tuple) or os.environ.get("CI") == "true":
            with test_serve_ui.chromium() as driver:
                assert test_serve_ui.ask_once(driver, url, "The quick brown fox", max_tokens=3, key=key, timeout=300)
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.emulated
def test_serve_service_is_installed_and_its_execstart_serves(deployed: dict, board, bundle_a: Path, lab: Path) -> None:
    """`deploy --service serve`. The lab board does not run systemd (PID 1 here is the sandbox's): the
    deploy writes the unit and the service's files, then says in one line that it could not start it.
    What is checked beyond that: the unit (`systemd-analyze verify`), its ExecStart line run as systemd
    would run it, answering deploy's own health check over SSH and the real openai client, and `status`."""
    import openai

    inst = board.install_dir
    # the board's model carries Qwen3's real chat template: tools and grammars run on the board too
    model = str(lab / "models" / "tiny-qwen3-template.gguf")
    Path(model).parent.mkdir(exist_ok=True)
    template = llama_source.default_dest(True) / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(inst / "current" / QWEN3), model,
                    "--chat-template-file", str(template), "--force"], check=True, capture_output=True)
    port = _free_port()
    key_file = lab / "service-key"
    key_file.write_text("svc-key\n")
    systemd_here = Path("/run/systemd/system").is_dir()
    result = run_cli("deploy", "--bundle", str(bundle_a), "--host", board.target, "--install-dir", str(inst),
                     "--service", "serve", "-m", model, "--port", str(port), "--api-key-file", str(key_file),
                     env=_env(lab), timeout=900)
    unit_name = "bmoe-edge-serve.service"
    if systemd_here:     # a lab whose board runs systemd: the real thing, then cleaned up
        try:
            assert result.returncode == 0, result.stderr[-2000:]
            assert subprocess.run(["systemctl", "is-active", unit_name], capture_output=True,
                                  text=True).stdout.strip() == "active"
        finally:
            subprocess.run(["systemctl", "disable", "--now", unit_name], capture_output=True)
            Path("/etc/systemd/system", unit_name).unlink(missing_ok=True)
            subprocess.run(["systemctl", "daemon-reload"], capture_output=True)
    else:
        assert_one_error(result, "does not run systemd", f"{inst}/systemd/{unit_name}", "itself is deployed")
    unit = inst / "systemd" / unit_name
    workdir = inst / "services" / "serve"
    assert (workdir / "api-key").read_text() == "svc-key" and (workdir / "api-key").stat().st_mode & 0o777 == 0o600
    state = json.loads((inst / "state.json").read_text())
    assert state["services"]["serve"]["port"] == port and state["services"]["serve"]["model"] == model
    if shutil.which("systemd-analyze"):
        verified = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr
    fields = _unit_fields(unit.read_text())
    assert fields["User"] == "root" and fields["ReadOnlyPaths"] == f'"{model}"'
    argv = shlex.split(fields["ExecStart"].replace("%%", "%").replace("$$", "$"))
    assert argv[:4] == [str(inst / "bin" / "bmoe-edge"), "serve", "--board", "qemu-arm64"]
    server = subprocess.Popen(argv, cwd=workdir, env={"PATH": os.environ["PATH"]}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, preexec_fn=emulate._no_core_dumps)
    try:
        spec = services.spec_for("serve", model=model, bind="127.0.0.1", port=port, api_key="svc-key")
        b, _layout = board_state.connect(fleet_targets.parse_target(board.target),
                                         remote.SshOptions(ssh_config=lab / "ssh_config"), install_dir=str(inst))
        with b:
            services.wait_healthy(b, spec, timeout=600)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="svc-key", max_retries=0, timeout=300)
        reply = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=3, temperature=0,
                                               messages=[{"role": "user", "content": "The quick brown fox"}])
        assert reply.usage.completion_tokens == 3
        weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]}}, "required": ["city"],
            "additionalProperties": False}}}
        called = client.chat.completions.create(model=reply.model, max_tokens=150, temperature=0, tools=[weather],
                                                tool_choice="required",
                                                messages=[{"role": "user", "content": "Weather in Oslo?"}])
        assert called.choices[0].finish_reason == "tool_calls", called.choices[0]
        [call] = called.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Oslo", "Paris")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0).models.list()
        _chat_page_through_a_forwarded_port(board, lab, port, "svc-key")
    finally:
        server.terminate()
        server.wait(timeout=60)
    status = _host(run_cli("status", "--host", board.target, "--json", env=_env(lab), timeout=120))
    assert status["services"]["serve"]["port"] == port
    if not systemd_here:
        assert status["services"]["serve"]["state"] == "not running (the board does not run systemd)"
    text = run_cli("status", "--host", board.target, env=_env(lab), timeout=120)
    assert "service:     serve " in text.stdout and f"127.0.0.1:{port}" in text.stdout, text.stdout
    # the key is never dropped by leaving it out: an empty key file is refused here, a service spec without
    # a key refused on the board (the key stays), --no-auth removes it on purpose
    empty = lab / "empty-key"
    empty.write_text(" \n")
    assert_one_error(run_cli("deploy", "--bundle", str(bundle_a), "--host", board.target, "--install-dir", str(inst),
                             "--service", "serve", "-m", model, "--api-key-file", str(empty), env=_env(lab)),
                     "holds no key", "--no-auth")
    b, layout = board_state.connect(fleet_targets.parse_target(board.target),
                                    remote.SshOptions(ssh_config=lab / "ssh_config"), install_dir=str(inst))
    keyless = services.spec_for("serve", model=model, bind="127.0.0.1", port=port, api_key=None)
    with b, pytest.raises(BmoeError, match="has an API key and this deploy gives none"):
        services.install_service(b, layout, keyless, board_name="qemu-arm64", ram_mb=1024, log=lambda _m: None)
    assert (workdir / "api-key").read_text() == "svc-key"


@pytest.mark.slow
@pytest.mark.emulated
def test_rpc_worker_service_execstart_serves_rpc_on_the_board(deployed: dict, board, bundle_a: Path,
                                                               lab: Path) -> None:
    """A fleet inventory's `role: rpc-worker` board (what `deploy --service rpc-worker` does too): the
    unit is written (the lab board does not run systemd), and its ExecStart line starts the bundle's
    aarch64 rpc-server through the board's exec wrapper, on loopback at the inventory's `rpc_port`,
    answering llama.cpp's RPC hello with this build's protocol."""
    import yaml

    from bmoe_edge.engine import native, rpc

    inst = board.install_dir
    port = _free_port()
    inventory = lab / "fleet.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": [{"host": board.target, "install_dir": str(inst),
                                                    "role": "rpc-worker", "rpc_port": port}]}))
    result = run_cli("deploy", "--bundle", str(bundle_a), "--inventory", str(inventory), env=_env(lab), timeout=900)
    unit_name = "bmoe-edge-rpc-worker.service"
    if not Path("/run/systemd/system").is_dir():
        assert_one_error(result, "does not run systemd", f"{inst}/systemd/{unit_name}", "itself is deployed")
    unit = inst / "systemd" / unit_name
    if shutil.which("systemd-analyze"):
        verified = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr
    argv = shlex.split(_unit_fields(unit.read_text())["ExecStart"].replace("%%", "%").replace("$$", "$"))
    assert argv[1:] == ["rpc-worker", "--board", "qemu-arm64", "--bind", "127.0.0.1", "--port", str(port)]
    assert json.loads((inst / "state.json").read_text())["services"]["rpc-worker"]["port"] == port
    workdir = inst / "services" / "rpc-worker"
    worker = subprocess.Popen(argv, cwd=workdir, env={"PATH": os.environ["PATH"]}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, preexec_fn=emulate._no_core_dumps)
    try:
        protocol = native.load().build_info().rpc_protocol
        deadline = time.monotonic() + 300
        while True:
            try:
                found = rpc.probe(rpc.Endpoint("127.0.0.1", port), protocol, timeout=30)
                break
            except BmoeError:
                assert worker.poll() is None, worker.stderr.read()[-2000:]
                assert time.monotonic() < deadline, "the worker did not answer"
                time.sleep(1)
        assert found.protocol.split(".")[0] == protocol.split(".")[0] and found.devices >= 1
    finally:
        worker.terminate()
        worker.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.emulated
def test_hostile_prompts_and_paths_pass_through_unharmed(deployed: dict, board, bundle_a: Path, lab: Path,
                                                         tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    prompt = f"a\"b $(touch {sentinel}) `touch {sentinel}` \n c 'q' ; touch {sentinel} \\ end"
    odd_name = f"pwned-{os.getpid()}"         # a relative name: it would land in the remote home directory
    odd_dir = tmp_path / f"we'ird $(touch {odd_name}) `touch {odd_name}` dir"
    odd_dir.mkdir()
    model = odd_dir / 'm "x"\nnl.gguf'
    shutil.copyfile(bundle_a / QWEN3, model)
    args = ["-p", prompt, "-n", "6", "--json", "--no-stream"]
    remote_run = run_cli("generate", "--host", board.target, "-m", str(model), *args, env=_env(lab), timeout=600)
    assert remote_run.returncode == 0, remote_run.stderr[-2000:]
    # the same prompt given to the same bundle locally (argv, no shell): same tokens, same prompt length
    local = emulate.run_bundle(bundle_a, ["generate", "--board", "qemu-arm64", "-m", str(bundle_a / QWEN3), *args],
                             capture=True, timeout=600, cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-2000:]
    assert _token_ids(remote_run.stdout) == _token_ids(local.stdout) and len(_token_ids(local.stdout)) == 6
    assert _summary(remote_run.stdout)["prompt_tokens"] == _summary(local.stdout)["prompt_tokens"] > 10
    assert json.loads(remote_run.stdout.splitlines()[0])["model"] == str(model)
    assert not sentinel.exists() and not (Path.home() / odd_name).exists() and not (tmp_path / odd_name).exists()


@pytest.mark.slow
@pytest.mark.emulated
@pytest.mark.parametrize("stage", [pytest.param("uploaded", marks=pytest.mark.full_campaign), "before_switch"])
def test_tampered_file_on_the_board_is_refused(host_deployed: Path, host_board, host_a: Path, host_b: Path,
                                               tmp_path: Path, stage: str) -> None:
    board = host_board
    bundle_a, bundle_b = host_a, host_b
    a_id = bundle.load_manifest(bundle_a).bundle_id
    inst = _tree_with(host_deployed / "releases" / a_id, tmp_path / "inst")
    target = fleet_targets.parse_target(board.target)

    def tamper(release: str) -> None:
        with open(Path(release) / QWEN3, "r+b") as f:
            f.seek(4096)
            f.write(b"\xff" * 16)

    results = deploy.deploy(bundle_b, [target], ssh_config=board.ssh_config, install_dir=str(inst),
                            hooks={stage: tamper}, log=lambda _m: None)
    assert not results[0].ok
    assert QWEN3 in results[0].error and "sha256" in results[0].error and "refusing" in results[0].error
    assert _release_ok(inst, bundle_a) == a_id           # current untouched
    # a re-run repairs the release (the tampered file is fetched again: copied from A on the board) and switches
    results = deploy.deploy(bundle_b, [target], ssh_config=board.ssh_config, install_dir=str(inst),
                            log=lambda _m: None)
    r = results[0]
    assert r.ok, r.error
    assert r.files_uploaded + r.files_copied >= 1 and r.files_present == r.files - r.files_uploaded - r.files_copied
    assert _release_ok(inst, bundle_b) == bundle.load_manifest(bundle_b).bundle_id


def _watch(proc: subprocess.Popen[str], lines: list[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@pytest.mark.slow
@pytest.mark.emulated
@pytest.mark.parametrize("stage", [pytest.param("upload", marks=pytest.mark.full_campaign),
                                   pytest.param("install", marks=pytest.mark.full_campaign), "gates"])
def test_killed_deploy_leaves_current_valid_and_a_rerun_finishes(host_deployed: Path, host_board, host_a: Path,
                                                                  host_b: Path, lab: Path, tmp_path: Path,
                                                                  stage: str) -> None:
    board = host_board
    bundle_a, bundle_b = host_a, host_b
    a_id = bundle.load_manifest(bundle_a).bundle_id
    b_id = bundle.load_manifest(bundle_b).bundle_id
    if stage == "upload":   # a fresh board: the whole bundle travels
        inst, new, new_id = tmp_path / "inst", bundle_a, a_id
        inst.mkdir()
    else:                   # a board running A, deploying B
        inst, new, new_id = _tree_with(host_deployed / "releases" / a_id, tmp_path / "inst"), bundle_b, b_id
    partial = inst / "releases" / f".{new_id}.partial"
    cmd = [sys.executable, "-m", "bmoe_edge", "deploy", "--bundle", str(new), "--host", board.target,
           "--install-dir", str(inst), *(["--gates"] if stage == "gates" else [])]
    proc = subprocess.Popen(cmd, env=_env(lab), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    _watch(proc, lines)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if stage == "upload" and partial.is_dir() and sum(p.is_file() for p in partial.rglob("*")) >= 4:
                break
            if stage == "install" and partial.is_dir() and any(partial.glob("site.new.*")):
                break
            if stage == "gates" and any("running the gates" in ln for ln in lines):
                time.sleep(2)
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"the deploy ended before the {stage} step: {''.join(lines)}"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    if stage == "upload":
        assert not (inst / "current").exists() and partial.is_dir() and not (partial / "site").exists()
    else:
        assert _release_ok(inst, bundle_a) == a_id
    if stage in ("install", "gates"):   # what ran on the board for the deploy stops with the connection
        deadline = time.monotonic() + 30
        while _processes_mentioning(str(partial)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _processes_mentioning(str(partial))
    result = run_cli("deploy", "--bundle", str(new), "--host", board.target, "--install-dir", str(inst), "--json",
                     env=_env(lab), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    host = _host(result)
    if stage == "upload":
        assert host["files_present"] >= 3     # resumed, not restarted (the file being written is sent again)
    if stage == "gates":
        assert host["files_uploaded"] == 0     # the partial was complete: installed again and switched
    assert _release_ok(inst, new) == new_id
    assert not partial.exists()


@pytest.mark.slow
@pytest.mark.emulated
def test_fleet_deploys_in_parallel_and_reports_each_host(lab: Path, host_a: Path, board_bundle,
                                                        tmp_path: Path) -> None:
    """Two good boards (one with a hostile install dir), one that is not what the inventory says
    (an x86_64 machine listed as a Raspberry Pi 5), one whose install dir is read-only."""
    bundle_a = host_a
    dist = board_bundle("rpi5").parent    # the session's dist/, with the host bundle (bundle_a) beside it
    assert bundle_a.parent == dist
    names = ["fleet-a", "fleet-b", "fleet-pi"]
    boards = [emulated_board.start(lab, n) for n in names]
    ro_dir = tmp_path / "ro-install"
    ro_dir.mkdir()
    try:
        try:
            boards.append(emulated_board.start(lab, "fleet-ro", read_only=[ro_dir]))
            names.append("fleet-ro")
        except BmoeError as exc:
            print(f"no read-only host in this fleet: {exc}")
        dirs = [tmp_path / "a", tmp_path / "b 'quoted' $(x) dir", tmp_path / "pi", ro_dir]
        inventory = tmp_path / "fleet.yaml"
        hosts = [{"host": b.target, "install_dir": str(d)} for b, d in zip(boards, dirs, strict=False)]
        hosts[2]["board"] = "rpi5"
        inventory.write_text(json.dumps({"defaults": {"board": bundle_a.name}, "hosts": hosts}))   # JSON is YAML
        started = time.monotonic()
        result = run_cli("deploy", "--inventory", str(inventory), "--dist", str(dist), "--json", env=_env(lab),
                         timeout=1200)
        wall = time.monotonic() - started
        assert result.returncode == 1, result.stderr[-3000:]
        report = json.loads(result.stdout)
        by_host = {h["host"]: h for h in report["hosts"]}
        assert not report["ok"] and len(by_host) == len(boards)
        for b, d in zip(boards[:2], dirs[:2], strict=True):
            h = by_host[b.target]
            assert h["ok"], h["error"]
            assert _release_ok(d, bundle_a) == h["bundle_id"]
        pi = by_host[boards[2].target]
        assert not pi["ok"] and pi["board"] == "rpi5"
        assert "the board is x86_64 (uname -m)" in pi["error"] and "is for aarch64" in pi["error"]
        assert not (dirs[2] / "releases").exists()          # refused before anything was uploaded
        if "fleet-ro" in names:
            ro = by_host[boards[3].target]
            assert not ro["ok"] and "not writable" in ro["error"] and "Read-only file system" in ro["error"]
        ok_seconds = sum(by_host[b.target]["seconds"] for b in boards[:2])
        print(f"\nfleet of {len(boards)}: {wall:.1f} s wall, {ok_seconds:.1f} s of per-host deploy time")
        # the table, for humans: every host, which failed and why, non-zero exit
        table = run_cli("deploy", "--inventory", str(inventory), "--dist", str(dist), env=_env(lab), timeout=1200)
        assert table.returncode == 1
        out = table.stdout
        assert f"{len(boards) - 2} failed" in out.splitlines()[-1]
        pi_line = next(ln for ln in out.splitlines() if ln.startswith(boards[2].target))
        assert "FAILED" in pi_line and "x86_64" in pi_line
        assert sum(" ok " in ln for ln in out.splitlines()) == 2
    finally:
        for n in names:
            emulated_board.stop(lab, n)
