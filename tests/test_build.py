"""`bmoe-edge build --board X` and `bmoe-edge run`: plans, bundle verification, and (slow) real cross builds
proven under qemu-aarch64 with each board's CPU model."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from bmoe_edge.boards import build, bundle, checks, emulate, profiles
from bmoe_edge.boards import plan as build_plan
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof import gates

from conftest import REPO, assert_clean_error, run_cli

A76 = "armv8.2-a+dotprod+fp16"
PROMPT = "The quick brown fox"


# ---------------------------------------------------------------------------------------------------
# The plan (no compiler).


def test_plan_for_rpi5_cross_compiles_with_its_march_and_the_board_python_tag() -> None:
    plan = build_plan.plan_build(profiles.load_profile("rpi5"))
    assert plan.cross and plan.toolchain_file == REPO / "toolchains" / "aarch64-linux-gnu.cmake"
    assert plan.defines["BMOE_CPU_ARM_ARCH"] == A76
    assert plan.defines["CMAKE_TOOLCHAIN_FILE"].endswith("aarch64-linux-gnu.cmake")
    assert plan.wheel_tag == "cp311-cp311-linux_aarch64"
    assert plan.ext_name == "_native.cpython-311-aarch64-linux-gnu.so"
    settings = plan.config_settings()
    assert "wheel.tags=cp311-cp311-linux_aarch64" in settings
    assert "cmake.define.SKBUILD_SOABI=cpython-311-aarch64-linux-gnu" in settings
    assert any(s.startswith("cmake.define.Python_INCLUDE_DIR=") and "sysroots" in s for s in settings)


def test_boards_with_equal_flags_share_a_build_dir_and_others_do_not() -> None:
    rpi5, qemu, rpi4, host = (build_plan.plan_build(profiles.load_profile(n))
                              for n in ("rpi5", "qemu-arm64", "rpi4", "host"))
    assert rpi5.build_dir == qemu.build_dir
    assert rpi4.build_dir != rpi5.build_dir
    assert rpi4.defines["BMOE_CPU_ARM_ARCH"] == "armv8-a"
    assert not host.cross and host.toolchain_file is None and "BMOE_CPU_ARM_ARCH" not in host.defines
    assert host.wheel_tag == "cp311-cp311-linux_x86_64"
    assert rpi5.bundle_dir.name == "rpi5" and qemu.bundle_dir.name == "qemu-arm64"


def test_every_shipped_board_has_a_build_plan() -> None:
    for name in profiles.board_names():
        plan = build_plan.plan_build(profiles.load_profile(name))
        assert plan.wheel_tag.startswith("cp311-cp311-linux_"), name
        assert plan.build_dir.parent == REPO / "build", name


def test_malformed_profile_fails_before_any_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "badboard.yaml").write_text(
        "extends: [_cortex-a76, _debian-bookworm-arm64, _engine-defaults]\n"
        "vendor: nobody\npage_size: 4096\nram_mb: 4096\n"
        "storage: {kind: nvme, read_mb_s: 400}\n"
        "engine:\n  threads: 4\n"
        "  read_path: mmap\n"                     # line 8: not pread|odirect
        "  cache_floor_mb: 512\n  cache_ceil_mb: 2048\n  io_threads: 2\n"
        "ssh: {user: pi, install_dir: /opt/bmoe}\n")

    def no_compiler(*_a, **_k):
        raise AssertionError("a compiler step ran for a malformed profile")

    for name in ("compilers", "compile_wheel", "binutil"):
        monkeypatch.setattr(build, name, no_compiler)
    monkeypatch.setattr(build.llama_source, "fetch", no_compiler)
    monkeypatch.setattr(build.sysroot, "ensure_sysroot", no_compiler)
    with pytest.raises(BmoeError) as err:
        build.build_board("badboard", out=tmp_path / "dist", profile_dirs=profiles.profile_dirs([tmp_path]))
    message = str(err.value)
    assert "badboard.yaml:8" in message and "read_path" in message
    assert not (tmp_path / "dist").exists()
    # the command line says the same in one line, and leaves no build directory behind
    result = run_cli("build", "--board", "badboard", "--profiles-dir", str(tmp_path),
                     "--out", str(tmp_path / "dist"), cwd=tmp_path)
    assert_clean_error(result, "badboard.yaml:8", "read_path")
    assert not (tmp_path / "dist").exists()


def test_unknown_board_is_a_clean_error(tmp_path: Path) -> None:
    assert_clean_error(run_cli("build", "--board", "no-such-board", cwd=tmp_path), "unknown board profile")


# ---------------------------------------------------------------------------------------------------
# Bundles and their manifest (no compiler).


def _fake_bundle(root: Path) -> bundle.Manifest:
    (root / "wheels").mkdir(parents=True)
    (root / "launcher").mkdir()
    (root / "fixtures").mkdir()
    (root / "wheels" / "bmoe_edge-0.1.0-cp311-cp311-linux_aarch64.whl").write_bytes(b"wheel" * 100)
    (root / "wheels" / "dep-1.0-py3-none-any.whl").write_bytes(b"dep")
    (root / "launcher" / "bmoe-edge.sh").write_text("#!/bin/sh\n")
    (root / "fixtures" / "m-00001-of-00002.gguf").write_bytes(b"GGUF1")
    (root / "fixtures" / "m-00002-of-00002.gguf").write_bytes(b"GGUF2")
    (root / "profile").mkdir()
    profile = bundle.profile_path("qemu-arm64")
    (root / profile).write_text(profiles.profile_file_text(profiles.load_profile("qemu-arm64")))
    return bundle.write_manifest(
        root, board="qemu-arm64", arch="aarch64", profile=profile, python="3.11", glibc_required="2.34",
        needed_libs=["libc.so.6"], llama=bundle.LlamaPin("0.3.36", "a" * 64, "c" * 40, ()),
        compilers={"c": "gcc", "cxx": "g++"}, cmake_flags={"BMOE_CPU_ARM_ARCH": A76},
        bmoe_edge_version="0.1.0", wheel="wheels/bmoe_edge-0.1.0-cp311-cp311-linux_aarch64.whl",
        dependency_wheels=["wheels/dep-1.0-py3-none-any.whl"],
        fixtures=[bundle.Fixture("olmoe", "Q8_0", 2, ("fixtures/m-00001-of-00002.gguf",
                                                      "fixtures/m-00002-of-00002.gguf"))])


def test_manifest_round_trips_and_verifies(tmp_path: Path) -> None:
    written = _fake_bundle(tmp_path)
    assert bundle.load_manifest(tmp_path) == written
    assert bundle.verify_bundle(tmp_path) == written
    assert written.bundle_id.startswith("qemu-arm64-0.1.0-") and len(written.bundle_id.rsplit("-", 1)[1]) == 12
    assert written.wheels[0].endswith("linux_aarch64.whl")
    assert {f.path for f in written.files} == {
        "wheels/bmoe_edge-0.1.0-cp311-cp311-linux_aarch64.whl", "wheels/dep-1.0-py3-none-any.whl",
        "launcher/bmoe-edge.sh", "fixtures/m-00001-of-00002.gguf", "fixtures/m-00002-of-00002.gguf",
        "profile/qemu-arm64.yaml"}
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["profile"] == "profile/qemu-arm64.yaml" and data["format_version"] == bundle.FORMAT_VERSION
    # the bundle's profile file is the resolved profile itself, read as it is
    assert bundle.bundle_profile(tmp_path, written) == profiles.load_profile("qemu-arm64")


@pytest.mark.parametrize("tamper, needle", [
    (lambda d: (d / "fixtures" / "m-00002-of-00002.gguf").write_bytes(b"GGUF3"), "m-00002-of-00002.gguf sha256"),
    (lambda d: (d / "fixtures" / "m-00002-of-00002.gguf").write_bytes(b"GGUF22"), "m-00002-of-00002.gguf has 6 bytes"),
    (lambda d: (d / "launcher" / "bmoe-edge.sh").unlink(), "bmoe-edge.sh is listed in the manifest but missing"),
    (lambda d: (d / "launcher" / "extra.sh").write_text("x"), "launcher/extra.sh is not listed"),
    (lambda d: (d / "wheels" / "evil.whl").symlink_to("/etc/passwd"), "wheels/evil.whl is a symlink"),
])
def test_tampered_bundle_fails_verification_naming_the_file(tmp_path: Path, tamper, needle: str) -> None:
    _fake_bundle(tmp_path)
    tamper(tmp_path)
    with pytest.raises(BmoeError, match="bundle") as err:
        bundle.verify_bundle(tmp_path)
    assert needle in str(err.value)


@pytest.mark.parametrize("bad_path", ["/etc/passwd", "../outside", "wheels/../../x", "./wheels/a", "a//b", ""])
def test_manifest_paths_must_stay_inside_the_bundle(tmp_path: Path, bad_path: str) -> None:
    _fake_bundle(tmp_path)
    data = json.loads((tmp_path / "manifest.json").read_text())
    data["files"][0]["path"] = bad_path
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BmoeError, match="not a plain relative path"):
        bundle.verify_bundle(tmp_path)


def test_edited_manifest_changes_the_bundle_id_check(tmp_path: Path) -> None:
    _fake_bundle(tmp_path)
    (tmp_path / "fixtures" / "m-00002-of-00002.gguf").write_bytes(b"GGUF3")
    data = json.loads((tmp_path / "manifest.json").read_text())
    entry = next(f for f in data["files"] if f["path"].endswith("m-00002-of-00002.gguf"))
    entry["sha256"] = bundle.sha256_file(tmp_path / "fixtures" / "m-00002-of-00002.gguf")
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BmoeError, match=r"bundle_id .* does not match its content"):
        bundle.verify_bundle(tmp_path)


def test_launcher_renders_the_exec_wrapper_for_emulated_boards_only(tmp_path: Path) -> None:
    qemu = profiles.load_profile("qemu-arm64")
    root = build.sysroot.sysroot_for("aarch64", "3.11")
    build.render_launcher(qemu, root, tmp_path / "qemu")
    text = (tmp_path / "qemu" / "bmoe-edge.sh").read_text()
    assert "@" + "EXEC_PREFIX@" not in text and "@" + "PYTHON@" not in text
    assert 'exec qemu-aarch64 -cpu cortex-a76 -L "${sysroot}" "$python" "$@"' in text
    assert f"BMOE_EDGE_SYSROOT:-{root.path}" in text and '"$sysroot"/usr/bin/python3.11' in text
    build.render_launcher(profiles.load_profile("rpi5"), root, tmp_path / "rpi5")
    text = (tmp_path / "rpi5" / "bmoe-edge.sh").read_text()
    assert "qemu" not in text and "BMOE_EDGE_PYTHON:-python3.11" in text and 'exec "$python"' in text
    for board in ("qemu", "rpi5"):
        subprocess.run(["sh", "-n", str(tmp_path / board / "bmoe-edge.sh")], check=True)
        assert os.access(tmp_path / board / "bmoe-edge.sh", os.X_OK)


def test_elf_checks_read_this_interpreter() -> None:
    exe = Path(os.path.realpath(sys.executable))
    assert checks.elf_machine(exe) == build_plan.host_arch()
    assert "libc.so.6" in checks.needed_libs(exe)
    versions = checks.glibc_versions(exe)
    assert versions and all(v.startswith("2.") for v in versions)


# ---------------------------------------------------------------------------------------------------
# Real builds (slow): qemu-arm64 and rpi5 share one build dir; rpi4 has its own. Each bundle is built
# once per session (conftest.board_bundle) and shared with the deploy and tune tests.


@pytest.fixture(scope="module")
def rpi5_bundle(board_bundle, qemu_bundle: Path) -> Path:
    return board_bundle("rpi5")   # after qemu-arm64: the same build dir, warm


@pytest.fixture(scope="module")
def rpi4_bundle(board_bundle) -> Path:
    return board_bundle("rpi4")


def _extension(bundle_dir: Path, manifest: bundle.Manifest, into: Path) -> Path:
    with zipfile.ZipFile(bundle_dir / manifest.wheel) as zf:
        return Path(zf.extract(str(manifest.extra["extension"]), into))


def _token_ids(stdout: str) -> list[int]:
    return [rec["id"] for rec in map(json.loads, stdout.splitlines()) if rec.get("type") == "token"]


def _generate(bundle_dir: Path, cpu: str | None, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    manifest = bundle.load_manifest(bundle_dir)
    model = bundle_dir / next(fx for fx in manifest.fixtures if fx.arch == "qwen3moe").files[0]
    return emulate.run_bundle(bundle_dir, ["generate", "-m", str(model), "-p", PROMPT, "-n", "6", "--json",
                                         "-t", "1", "--ctx", "128", *extra],
                            cpu=cpu, capture=True, timeout=600, cwd=tmp)


@pytest.mark.slow
@pytest.mark.emulated
def test_qemu_arm64_bundle_verifies_and_carries_an_aarch64_extension(qemu_bundle: Path, tmp_path: Path) -> None:
    manifest = bundle.verify_bundle(qemu_bundle)
    assert manifest.board == "qemu-arm64" and manifest.arch == "aarch64"
    assert manifest.wheel.endswith("-cp311-cp311-linux_aarch64.whl")
    ext = _extension(qemu_bundle, manifest, tmp_path)
    assert ext.name == "_native.cpython-311-aarch64-linux-gnu.so"
    assert checks.elf_machine(ext) == "aarch64"
    assert manifest.extra["rpc_server"] == checks.RPC_SERVER  # llama.cpp's RPC worker, checked like the extension
    assert manifest.extra["llama_bench"] == checks.LLAMA_BENCH  # and its llama-bench, bench's anchor on a board
    with zipfile.ZipFile(qemu_bundle / manifest.wheel) as zf:
        for program in checks.PROGRAMS:
            assert checks.elf_machine(Path(zf.extract(program, tmp_path))) == "aarch64"
    assert manifest.cmake_flags["GGML_RPC"] == "ON"
    assert "ARM aarch64" in subprocess.run(["file", "-b", str(ext)], capture_output=True, text=True).stdout
    assert manifest.cmake_flags["ggml_cpu_march_used"] == A76
    assert manifest.cmake_flags["GGML_NATIVE"] == "OFF" and manifest.cmake_flags["GGML_OPENMP"] == "OFF"
    assert set(manifest.needed_libs) <= set(bundle.bundle_profile(qemu_bundle, manifest).libs)
    with zipfile.ZipFile(qemu_bundle / manifest.wheel) as zf:   # the wheel carries the shipped profiles
        shipped = {n.removeprefix("bmoe_edge/board_profiles/") for n in zf.namelist()
                   if n.startswith("bmoe_edge/board_profiles/")}
    assert shipped == {p.name for p in (REPO / "board_profiles").glob("*.yaml")}
    assert tuple(map(int, manifest.glibc_required.split("."))) <= (2, 36)
    assert manifest.llama.upstream_commit == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert manifest.llama.patches and all(len(p["sha256"]) == 64 for p in manifest.llama.patches)
    assert any(w.startswith("wheels/pyyaml-") and "aarch64" in w for w in manifest.dependency_wheels)
    assert any(w.startswith("wheels/typer-") for w in manifest.dependency_wheels)
    assert manifest.fixtures and all(f in {e.path for e in manifest.files}
                                     for fx in manifest.fixtures for f in fx.files)


@pytest.mark.slow
@pytest.mark.emulated
def test_qemu_arm64_version_under_qemu_reports_aarch64_with_the_hook(qemu_bundle: Path, tmp_path: Path) -> None:
    result = run_cli("run", "--board", "qemu-arm64", "--bundle", str(qemu_bundle), "--", "--version",
                     cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "hook: yes" in result.stdout and "machine: aarch64" in result.stdout


@pytest.mark.slow
@pytest.mark.emulated
def test_streamed_generate_equals_resident_under_qemu(qemu_bundle: Path, tmp_path: Path) -> None:
    streamed = _generate(qemu_bundle, None, tmp_path, "--stream", "--cache-mb", "0")
    resident = _generate(qemu_bundle, None, tmp_path, "--no-stream")
    assert streamed.returncode == 0 and resident.returncode == 0, streamed.stderr + resident.stderr
    assert len(_token_ids(streamed.stdout)) == 6
    assert _token_ids(streamed.stdout) == _token_ids(resident.stdout)


@pytest.mark.slow
@pytest.mark.emulated
@pytest.mark.full_campaign
def test_quick_gates_pass_under_qemu(qemu_bundle: Path, tmp_path: Path) -> None:
    """The same quick matrix of the same bundle under the same qemu CPU runs in every suite through
    `deploy --gates` (test_deploy.py, the `deployed` fixture); this direct run repeats it."""
    result = emulate.run_bundle(qemu_bundle, ["gates", "--quick", "--json", "--fixtures",
                                              str(qemu_bundle / "fixtures")], capture=True, timeout=1200, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    report = json.loads(result.stdout)
    assert report["failed"] == 0 and report["passed"] == len(gates.quick_matrix())


@pytest.mark.slow
@pytest.mark.emulated
def test_launcher_installs_and_runs_a_release(qemu_bundle: Path, tmp_path: Path) -> None:
    """The deploy path in miniature: copy the bundle as a release, --install-site, run through `current`."""
    release = tmp_path / "releases" / bundle.load_manifest(qemu_bundle).bundle_id
    shutil.copytree(qemu_bundle, release)
    (tmp_path / "current").symlink_to(release)
    launcher = tmp_path / "current" / "launcher" / "bmoe-edge.sh"
    subprocess.run([str(launcher), "--install-site"], check=True, timeout=300, cwd=tmp_path)
    assert (release / "site" / "bmoe_edge" / "__init__.py").is_file()
    result = subprocess.run([str(launcher), "--version"], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path, preexec_fn=emulate._no_core_dumps)
    assert result.returncode == 0, result.stderr
    assert "hook: yes" in result.stdout and "machine: aarch64" in result.stdout


@pytest.mark.slow
@pytest.mark.emulated
def test_rpi5_bundle_runs_on_cortex_a76_and_dies_of_sigill_on_cortex_a72(
    rpi5_bundle: Path, tmp_path: Path,
) -> None:
    bundle_dir = rpi5_bundle
    manifest = bundle.verify_bundle(bundle_dir)
    assert manifest.cmake_flags["ggml_cpu_march_used"] == A76 and manifest.cmake_flags["BMOE_CPU_ARM_ARCH"] == A76
    version = emulate.run_bundle(bundle_dir, ["--version"], cpu="cortex-a76", capture=True, timeout=300)
    assert version.returncode == 0 and "hook: yes" in version.stdout, version.stderr
    ok = _generate(bundle_dir, "cortex-a76", tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert len(_token_ids(ok.stdout)) == 6
    # the same bundle on a Pi 4's CPU: the dotprod/fp16 kernels are illegal instructions there
    dead = _generate(bundle_dir, "cortex-a72", tmp_path)
    assert dead.returncode in (-4, 132), (dead.returncode, dead.stderr[-2000:])
    assert emulate.exit_code(dead.returncode) == 132


@pytest.mark.slow
@pytest.mark.emulated
def test_rpi4_bundle_uses_armv8_a_and_runs_on_cortex_a72(rpi4_bundle: Path, tmp_path: Path) -> None:
    manifest = bundle.verify_bundle(rpi4_bundle)
    assert manifest.cmake_flags["ggml_cpu_march_used"] == "armv8-a"
    assert Path(str(manifest.extra["build_dir"])).name == "board-aarch64-armv8-a-cp311"
    version = emulate.run_bundle(rpi4_bundle, ["--version"], capture=True, timeout=300)  # qemu_cpu
    assert version.returncode == 0 and "hook: yes" in version.stdout, version.stderr
    result = _generate(rpi4_bundle, "cortex-a72", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(_token_ids(result.stdout)) == 6


@pytest.mark.slow
def test_second_unchanged_build_takes_under_a_minute(qemu_bundle: Path, tmp_path: Path) -> None:
    first = bundle.load_manifest(qemu_bundle)
    started = time.monotonic()   # into another dist/: the session's bundle stays as the other tests saw it
    again = build.build_board("qemu-arm64", out=tmp_path / "dist", quiet=True, log=lambda _m: None)
    elapsed = time.monotonic() - started
    assert elapsed < 60, f"warm build took {elapsed:.0f} s"
    # nothing changed, so neither did the bundle
    assert again.manifest.bundle_id == first.bundle_id


@pytest.mark.slow
@pytest.mark.parametrize("field, value, needle", [
    ("glibc", '"2.30"', "need GLIBC_2.3"),
    ("libs", "[libc.so.6, libm.so.6, libgcc_s.so.1, ld-linux-aarch64.so.1]", "need libstdc++.so.6"),
])
def test_output_checks_fail_the_build_with_a_clear_error(
    qemu_bundle: Path, tmp_path: Path, field: str, value: str, needle: str,
) -> None:
    """A user profile that differs from qemu-arm64 only in what the board provides: same build dir
    (warm), and the check on the binaries refuses to make a bundle."""
    (tmp_path / "strict.yaml").write_text(f"extends: qemu-arm64\n{field}: {value}\n")
    with pytest.raises(BmoeError, match="board strict") as err:
        build.build_board("strict", out=tmp_path / "dist", profile_dirs=profiles.profile_dirs([tmp_path]),
                          fixtures=False, quiet=True, log=lambda _m: None)
    assert needle in str(err.value)
    assert not (tmp_path / "dist" / "strict").exists()


@pytest.mark.slow
def test_march_and_hook_checks_compare_with_what_the_build_used(
    qemu_bundle: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = build_plan.plan_build(profiles.load_profile("qemu-arm64"))
    wheel = next((plan.build_dir / "wheelhouse").glob("*.whl"))
    assert checks.check_build(plan, wheel).march_used == A76
    as_pi4 = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, march="armv8-a"))
    with pytest.raises(BmoeError, match=r"compiled with -march=armv8\.2-a\+dotprod\+fp16, .* needs armv8-a"):
        checks.check_build(as_pi4, wheel)
    monkeypatch.setattr(checks, "defined_symbols", lambda *_a: set())
    with pytest.raises(BmoeError, match="ggml_cpu_set_expert_ready_hook is not in"):
        checks.check_build(plan, wheel)
    no_hook = dataclasses.replace(plan, profile=dataclasses.replace(plan.profile, hook=False))
    assert checks.check_build(no_hook, wheel).hook is False


@pytest.mark.slow
def test_host_bundle_goes_through_the_same_path_natively(board_bundle, tmp_path: Path) -> None:
    host = board_bundle("host")
    manifest = bundle.verify_bundle(host)
    assert not manifest.extra["cross"] and manifest.wheel.endswith("-cp311-cp311-linux_x86_64.whl")
    assert manifest.cmake_flags["ggml_cpu_march_used"] == "" and manifest.cmake_flags["GGML_NATIVE"] == "OFF"
    version = emulate.run_bundle(host, ["--version"], capture=True, timeout=120, cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert "hook: yes" in version.stdout and "machine: x86_64" in version.stdout
