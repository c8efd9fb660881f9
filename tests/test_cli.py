"""The CLI shell: help, version, doctor, info, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import assert_clean_error, run_cli


def test_help_lists_the_commands() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("doctor", "info", "llama"):
        assert command in result.stdout


def test_version_shows_pin_and_hook() -> None:
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert "bmoe-edge 0.1.0" in result.stdout
    assert "llama-cpp-python==0.3.36" in result.stdout
    assert "0c1e57098bba43ac29e6e3b677cdceebdd22334f" in result.stdout
    assert "hook: yes" in result.stdout


def test_doctor_json_reports_every_tool() -> None:
    result = run_cli("doctor", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == (0 if report["ok"] else 1)
    tools = {c["tool"] for c in report["checks"]}
    assert {"cmake", "ccache", "aarch64-linux-gnu-gcc", "qemu-aarch64", "ssh", "/usr/sbin/sshd"} <= tools
    for check in report["checks"]:
        assert (check["found"] is None) == (check["fix"] is not None)
        if check["fix"]:
            assert check["fix"].startswith("apt-get install -y ")


def test_doctor_names_the_apt_command_for_a_missing_tool(tmp_path: Path) -> None:
    # An empty PATH hides every tool looked up on PATH: each gets its apt-get line.
    result = run_cli("doctor", env={"PATH": str(tmp_path), "HOME": str(tmp_path)})
    assert result.returncode == 1
    assert "MISSING cmake" in result.stdout and "apt-get install -y cmake" in result.stdout
    assert "crossbuild-essential-arm64" in result.stdout


def test_info_on_a_real_gguf(vocab_gguf: Path) -> None:
    result = run_cli("info", str(vocab_gguf), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["architecture"] == "llama"
    assert summary["n_vocab"] == 32000
    assert summary["is_moe"] is False


def test_info_on_a_missing_path() -> None:
    assert_clean_error(run_cli("info", "/no/such/model.gguf"), "/no/such/model.gguf", "No such file")


def test_info_on_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("hello, not a model\n")
    assert_clean_error(run_cli("info", str(bogus)), "not a gguf")


def test_info_on_a_truncated_gguf(tmp_path: Path, vocab_gguf: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(vocab_gguf.read_bytes()[: 4096])
    assert_clean_error(run_cli("info", str(truncated)), "truncated.gguf")
