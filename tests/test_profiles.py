"""Board profiles: the shipped ones resolve, every malformed one fails naming file, line and field."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bmoe_edge.boards import profiles
from bmoe_edge.cli import app
from bmoe_edge.errors import BmoeError

from conftest import REPO, assert_clean_error, run_cli

SHIPPED = {"rpi5", "rpi4", "orangepi5", "rock5b", "jetson-orin-nano", "host", "qemu-arm64", "qemu-arm64-i8mm"}

# A complete, valid board with no `extends`: each error test breaks one line of it.
GOOD = """\
name: tb
vendor: test
arch: aarch64
cpu: cortex-a76
march: armv8.2-a+dotprod+fp16
toolchain: aarch64-linux-gnu.cmake
page_size: 4096
ram_mb: 4096
storage:
  kind: nvme
  read_mb_s: 400
python: "3.11"
glibc: "2.36"
qemu_cpu: cortex-a76
libs: [libc.so.6, libm.so.6]
ssh:
  user: pi
  install_dir: /home/pi/bmoe-edge
engine:
  threads: 4
  io_threads: 2
  read_path: pread
  cache_mb: auto
  cache_floor_mb: 512
  cache_ceil_mb: 2048
  dense: mmap
  overlap: true
"""


ENGINE_KEYS = {"threads", "io_threads", "read_path", "cache_mb", "cache_floor_mb", "cache_ceil_mb", "dense", "overlap"}


def field(key: str) -> str:
    """How an error names a field: engine settings sit under `engine:`."""
    return f"engine.{key}" if key in ENGINE_KEYS else key


def line_of(text: str, start: str) -> int:
    """1-based line of the first line of `text` starting with `start` (indentation ignored)."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.lstrip().startswith(start.lstrip()))


def edit(text: str, key: str, new: str | None) -> str:
    """Replace the line `key: ...` with `new`, at the same indentation (None: delete it)."""
    pattern = re.compile(rf"^( *){re.escape(key)}:.*\n", re.M)
    found = pattern.search(text)
    assert found, key
    indent = found.group(1)
    replacement = "" if new is None else "".join(f"{indent}{line}\n" for line in new.split("\n"))
    return text[:found.start()] + replacement + text[found.end():]


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(text)
    return path


def load_error(tmp_path: Path, name: str = "tb") -> str:
    with pytest.raises(BmoeError) as caught:
        profiles.load_profile(name, [tmp_path])
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- the shipped profiles ---------------------------------------------------------------------------


def test_every_shipped_profile_resolves() -> None:
    found, errors = profiles.load_all([profiles.shipped_dir()])
    assert errors == []
    assert {p.name for p in found} == SHIPPED
    for p in found:
        assert p.source.parent == profiles.shipped_dir()
        assert p.ram_mb > p.engine["cache_ceil_mb"] > 0 if p.engine["cache_mb"] == "auto" else True
        assert (p.arch == "aarch64") == (p.march is not None) == (p.qemu_cpu is not None)


def test_shipped_profiles_are_the_top_level_board_profiles() -> None:
    # The source of truth is the checkout's board_profiles/ (the wheel carries a copy: test_build).
    assert profiles.shipped_dir() == REPO / "board_profiles"
    assert {p.stem for p in profiles.shipped_dir().glob("*.yaml")} >= SHIPPED


def test_rpi5_and_rpi4_flags() -> None:
    rpi5 = profiles.load_profile("rpi5")
    assert (rpi5.arch, rpi5.cpu, rpi5.march) == ("aarch64", "cortex-a76", "armv8.2-a+dotprod+fp16")
    assert rpi5.page_size == 16384
    assert rpi5.storage == profiles.Storage("nvme", 430, read_iops=50000)
    assert rpi5.storage_class == "rpi5-nvme-gen2"
    assert (rpi5.python, rpi5.glibc, rpi5.qemu_cpu) == ("3.11", "2.36", "cortex-a76")
    assert rpi5.toolchain == "aarch64-linux-gnu.cmake"
    assert "libgomp.so.1" not in rpi5.libs and "libstdc++.so.6" in rpi5.libs
    assert rpi5.hook is True and rpi5.exec_wrapper is None and not rpi5.emulated
    assert [p.name for p in rpi5.files] == [
        "_cortex-a76.yaml", "_debian-bookworm-arm64.yaml", "_engine-defaults.yaml", "_storage-rpi5-nvme-gen2.yaml",
        "rpi5.yaml"]

    rpi4 = profiles.load_profile("rpi4")
    assert (rpi4.cpu, rpi4.march, rpi4.qemu_cpu) == ("cortex-a72", "armv8-a", "cortex-a72")
    assert rpi4.page_size == 4096


def test_rk3588_jetson_host_and_qemu() -> None:
    for name in ("orangepi5", "rock5b"):
        p = profiles.load_profile(name)
        assert (p.march, p.qemu_cpu, p.engine["threads"]) == ("armv8.2-a+dotprod+fp16", "cortex-a76", 4)
    jetson = profiles.load_profile("jetson-orin-nano")
    assert (jetson.cpu, jetson.qemu_cpu, jetson.glibc) == ("cortex-a78ae", "cortex-a76", "2.35")

    host = profiles.load_profile("host")
    assert (host.arch, host.march, host.toolchain, host.qemu_cpu) == ("x86_64", None, "native", None)

    qemu = profiles.load_profile("qemu-arm64")
    assert qemu.emulated and qemu.ssh.host == "127.0.0.1"
    assert qemu.exec_prefix(Path("/sr")) == ["qemu-aarch64", "-cpu", "cortex-a76", "-L", "/sr"]


@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="qemu-aarch64 not installed")
def test_every_qemu_cpu_is_a_real_qemu_model() -> None:
    models = subprocess.run(["qemu-aarch64", "-cpu", "help"], capture_output=True, text=True).stdout.split()
    found, _ = profiles.load_all([profiles.shipped_dir()])
    for p in found:
        if p.qemu_cpu:
            assert p.qemu_cpu in models, (p.name, p.qemu_cpu)


def test_to_dict_is_itself_a_valid_profile(tmp_path: Path) -> None:
    for name in SHIPPED:
        original = profiles.load_profile(name)
        write(tmp_path, name, yaml.safe_dump(original.to_dict()))
        assert profiles.load_profile(name, [tmp_path]) == original


# --- user profiles -----------------------------------------------------------------------------------


def test_user_dir_overrides_by_name_and_can_extend_the_shipped_one(tmp_path: Path) -> None:
    write(tmp_path, "rpi5", "extends: rpi5\nram_mb: 4096\nssh: {user: alice}\n")
    dirs = profiles.profile_dirs([tmp_path], environ={})
    p = profiles.load_profile("rpi5", dirs)
    assert p.source == (tmp_path / "rpi5.yaml").resolve()
    assert p.ram_mb == 4096
    assert p.march == "armv8.2-a+dotprod+fp16" and p.page_size == 16384
    assert (p.ssh.user, p.ssh.install_dir) == ("alice", "/home/pi/bmoe-edge")  # ssh merges key by key


def test_user_board_from_env_var_and_user_fragment_override(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    write(one, "myboard", "extends: [_cortex-a76, _debian-bookworm-arm64, _engine-defaults]\n"
          "vendor: me\npage_size: 4096\nram_mb: 2048\nstorage: {kind: sd, read_mb_s: 45}\n"
          "engine: {threads: 4, io_threads: 1, cache_floor_mb: 256, cache_ceil_mb: 1024}\n"
          "ssh: {user: me, install_dir: /opt/bmoe}\n")
    write(two, "_engine-defaults", "engine:\n  read_path: pread\n  cache_mb: 100\n  dense: anon\n  overlap: false\n")
    dirs = profiles.profile_dirs(environ={profiles.PROFILES_ENV: f"{one}{os.pathsep}{two}"})
    assert dirs[:2] == [one.resolve(), two.resolve()]
    mine = profiles.load_profile("myboard", dirs)
    assert [mine.engine[k] for k in ("read_path", "cache_mb", "dense", "overlap")] == ["pread", 100, "anon", False]
    assert "myboard" in profiles.board_names(dirs)
    # The shipped boards now see the user's fragment too: theirs override ours by name.
    assert profiles.load_profile("rpi5", dirs).engine["read_path"] == "pread"


def test_missing_profiles_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(BmoeError, match=r"profiles directory .*nope \(from --profiles-dir\) does not exist"):
        profiles.profile_dirs([tmp_path / "nope"], environ={})
    with pytest.raises(BmoeError, match=r"from \$BMOE_EDGE_PROFILES"):
        profiles.profile_dirs(environ={profiles.PROFILES_ENV: str(tmp_path / "nope")})


def test_load_profile_file(tmp_path: Path) -> None:
    path = write(tmp_path, "tb", GOOD)
    p = profiles.load_profile_file(path)
    assert (p.name, p.engine["read_path"], p.hook, p.ssh.port) == ("tb", "pread", True, None)


# --- errors: file, line, field -----------------------------------------------------------------------


def expect(tmp_path: Path, text: str, line: int, field: str, *needles: str, file: str = "tb") -> str:
    message = load_error(tmp_path)
    prefix = f"{(tmp_path / f'{file}.yaml').resolve()}:{line}: field '{field}': "
    assert message.startswith(prefix), message
    for needle in needles:
        assert needle in message, message
    return message


def test_bad_enum_value(tmp_path: Path) -> None:
    text = edit(GOOD, "read_path", "read_path: odirekt")
    write(tmp_path, "tb", text)
    message = expect(tmp_path, text, line_of(text, "read_path"), "engine.read_path")
    assert message.endswith("field 'engine.read_path': 'odirekt' is not one of pread, odirect")


def test_unknown_field_suggests_the_close_one(tmp_path: Path) -> None:
    text = GOOD + "  io_thread: 3\n"
    write(tmp_path, "tb", text)
    expect(tmp_path, text, line_of(text, "io_thread:"), "engine.io_thread",
           "unknown field", "did you mean 'io_threads'")


def test_an_engine_setting_at_the_top_level_says_where_it_goes(tmp_path: Path) -> None:
    text = GOOD + "threads: 3\n"
    write(tmp_path, "tb", text)
    expect(tmp_path, text, len(text.splitlines()), "threads", "engine settings go under `engine:` (engine.threads)")


def test_unknown_nested_field(tmp_path: Path) -> None:
    text = edit(GOOD, "ssh", "ssh:\n  usr: pi")
    write(tmp_path, "tb", text.replace("  user: pi\n", ""))
    text = (tmp_path / "tb.yaml").read_text()
    expect(tmp_path, text, line_of(text, "  usr"), "ssh.usr", "did you mean 'user'")


@pytest.mark.parametrize(("key", "bad", "needle"), [
    ("threads", "threads: four", "expected an integer, got a string ('four')"),
    ("overlap", "overlap: 1", "expected true, false or 'auto', got a number (1)"),
    ("python", "python: 3.10", 'got a number (3.1) (write it quoted: "3.10")'),
    ("libs", "libs: libc.so.6", "expected a list of strings, got a string"),
    ("storage", "storage: nvme", "expected a mapping, got a string ('nvme')"),
    ("cache_mb", "cache_mb: lots", "expected a number or 'auto', got a string ('lots')"),
    ("page_size", "page_size: 8192", "8192 is not one of 4096, 16384, 65536"),
    ("read_path", "read_path: auto", "'auto' is not one of pread, odirect"),
    ("threads", "threads: -1", "-1 is less than 0"),
    ("march", "march: armv8.2-a dotprod", "is not an Arm -march like armv8.2-a+dotprod+fp16"),
    ("glibc", "glibc: '236'", "is not a glibc version"),
])
def test_wrong_type_or_value(tmp_path: Path, key: str, bad: str, needle: str) -> None:
    text = edit(GOOD, key, bad)
    if key == "storage":
        text = text.replace("  kind: nvme\n  read_mb_s: 400\n", "")
    write(tmp_path, "tb", text)
    expect(tmp_path, text, line_of(text, f"{key}:"), field(key), needle)


def test_bad_list_item_names_its_own_line(tmp_path: Path) -> None:
    text = edit(GOOD, "libs", "libs:\n  - libc.so.6\n  - 42")
    write(tmp_path, "tb", text)
    expect(tmp_path, text, line_of(text, "  - 42"), "libs[1]", "expected a string, got a number (42)")


def test_bad_nested_enum(tmp_path: Path) -> None:
    text = GOOD.replace("  kind: nvme", "  kind: floppy")
    write(tmp_path, "tb", text)
    expect(tmp_path, text, line_of(text, "  kind"), "storage.kind",
           "'floppy' is not one of nvme, sd, emmc, ssd")


def test_missing_required_field(tmp_path: Path) -> None:
    text = edit(GOOD, "dense", None)
    write(tmp_path, "tb", text)
    expect(tmp_path, text, line_of(text, "engine:"), "engine.dense",
           "required, but neither this file nor what it extends sets it")


def test_missing_required_nested_field_points_at_its_mapping(tmp_path: Path) -> None:
    text = GOOD.replace("  read_mb_s: 400\n", "")
    write(tmp_path, "tb", text)
    expect(tmp_path, text, line_of(text, "storage"), "storage.read_mb_s", "required")


@pytest.mark.parametrize("empty", ["vendor:", "vendor: ''", "vendor: null"])
def test_required_field_set_to_nothing(tmp_path: Path, empty: str) -> None:
    text = edit(GOOD, "vendor", empty)
    write(tmp_path, "tb", text)
    expect(tmp_path, text, line_of(text, "vendor"), "vendor", "required, but set to nothing here")


def test_extends_loop(tmp_path: Path) -> None:
    write(tmp_path, "tb", "extends: _a\n" + edit(GOOD, "name", None))
    write(tmp_path, "_a", "extends: _b\n")
    write(tmp_path, "_b", "vendor: x\nextends: [_a]\n")
    message = load_error(tmp_path)
    assert message.startswith(f"{(tmp_path / '_b.yaml').resolve()}:2: field 'extends': "), message
    assert message.endswith("loop: _a -> _b -> _a"), message


def test_extends_itself_with_nothing_below_is_an_error(tmp_path: Path) -> None:
    text = "extends: tb\n" + GOOD
    write(tmp_path, "tb", text)
    expect(tmp_path, text, 1, "extends", "no profile or fragment named 'tb'")


def test_missing_fragment(tmp_path: Path) -> None:
    write(tmp_path, "_real", "engine: {dense: anon}\n")
    text = "vendor: v\nextends:\n  - _real\n  - _cortex-a99\n"
    write(tmp_path, "tb", text)
    expect(tmp_path, text, 4, "extends", "no profile or fragment named '_cortex-a99'", "fragments: _real")


def test_error_inside_a_fragment_names_the_fragment(tmp_path: Path) -> None:
    write(tmp_path, "_frag", "# a comment\nengine:\n  read_path: mmap\n")
    write(tmp_path, "tb", "extends: _frag\n" + edit(GOOD, "read_path", None))
    message = load_error(tmp_path)
    frag = (tmp_path / "_frag.yaml").resolve()
    assert message == f"{frag}:3: field 'engine.read_path': 'mmap' is not one of pread, odirect"


def test_yaml_syntax_error_has_its_line(tmp_path: Path) -> None:
    text = GOOD.replace("dense: mmap\n", "dense: [mmap\n")
    write(tmp_path, "tb", text)
    message = load_error(tmp_path)
    assert re.match(rf"{re.escape(str((tmp_path / 'tb.yaml').resolve()))}:\d+: YAML syntax error: ", message)
    line = int(message.split(":")[1])
    assert line_of(text, "dense") <= line <= line_of(text, "dense") + 2, message


def test_field_set_twice(tmp_path: Path) -> None:
    text = GOOD + "  threads: 2\n"
    write(tmp_path, "tb", text)
    first = line_of(GOOD, "threads")
    expect(tmp_path, text, len(text.splitlines()), "engine.threads", f"set twice (first on line {first})")


def test_name_must_be_the_file_name(tmp_path: Path) -> None:
    text = edit(GOOD, "name", "name: other")
    write(tmp_path, "tb", text)
    expect(tmp_path, text, 1, "name", "'other' differs from the file name 'tb'")


def test_arch_rules(tmp_path: Path) -> None:
    text = edit(GOOD, "march", None)
    write(tmp_path, "tb", text)
    expect(tmp_path, text, 1, "march", "required for an aarch64 board")

    text = edit(GOOD, "arch", "arch: x86_64")
    write(tmp_path, "tb", text)
    expect(tmp_path, text, line_of(text, "march"), "march", "an x86_64 board takes no march")


def test_cache_rules(tmp_path: Path) -> None:
    text = edit(GOOD, "cache_floor_mb", "cache_floor_mb: 4096")
    write(tmp_path, "tb", text)
    expect(tmp_path, text, line_of(text, "cache_floor_mb"), "engine.cache_floor_mb",
           "4096 MiB is not less than ram_mb 4096 (")

    text = edit(GOOD, "cache_floor_mb", None)
    write(tmp_path, "tb", text)
    expect(tmp_path, text, line_of(text, "engine:"), "engine.cache_floor_mb", "required when cache_mb is auto")

    write(tmp_path, "tb", edit(edit(edit(GOOD, "cache_floor_mb", None), "cache_ceil_mb", None),
                               "cache_mb", "cache_mb: 1000"))
    assert profiles.load_profile("tb", [tmp_path]).engine["cache_mb"] == 1000


def test_exec_wrapper_placeholders(tmp_path: Path) -> None:
    text = GOOD + "exec_wrapper: [qemu-aarch64, -L, '{root}']\n"
    write(tmp_path, "tb", text)
    expect(tmp_path, text, len(text.splitlines()), "exec_wrapper[2]", "the only placeholder is {sysroot}")


def test_not_a_mapping_and_empty_file(tmp_path: Path) -> None:
    write(tmp_path, "tb", "- a\n- b\n")
    assert load_error(tmp_path).endswith("tb.yaml:1: a profile must be a mapping of field: value")
    write(tmp_path, "tb", "# nothing\n")
    assert "tb.yaml:1: the file is empty" in load_error(tmp_path)


def test_unknown_profile_lists_the_known_ones(tmp_path: Path) -> None:
    write(tmp_path, "tb", GOOD)
    write(tmp_path, "_frag", "engine: {dense: anon}\n")
    assert load_error(tmp_path, "rpi6").startswith("unknown board profile 'rpi6'; known: tb (searched ")
    assert "is a fragment" in load_error(tmp_path, "_frag")


def test_load_all_keeps_going_past_a_broken_profile(tmp_path: Path) -> None:
    write(tmp_path, "tb", GOOD)
    write(tmp_path, "broken", edit(GOOD, "name", None) + "bogus: 1\n")
    found, errors = profiles.load_all([tmp_path])
    assert [p.name for p in found] == ["tb"]
    assert len(errors) == 1 and "broken.yaml:" in str(errors[0]) and "'bogus'" in str(errors[0])


# --- the CLI -----------------------------------------------------------------------------------------


def test_cli_list() -> None:
    result = run_cli("profiles", "list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "ARCH", "CPU", "MARCH", "RAM", "STORAGE"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == SHIPPED
    assert "armv8.2-a+dotprod+fp16" in rows["rpi5"] and "nvme 430 MB/s" in rows["rpi5"]
    assert "armv8-a " in rows["rpi4"]


def test_cli_show_json_and_yaml() -> None:
    result = run_cli("profiles", "show", "rpi5", "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["march"] == "armv8.2-a+dotprod+fp16" and record["page_size"] == 16384
    assert record["storage"] == {"kind": "nvme", "read_mb_s": 430, "read_iops": 50000}

    result = run_cli("profiles", "show", "qemu-arm64")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# qemu-arm64, resolved from: ")
    assert yaml.safe_load(result.stdout)["exec_wrapper"][0] == "qemu-aarch64"


def test_cli_profiles_dir_and_env_var(tmp_path: Path) -> None:
    write(tmp_path, "rpi5", "extends: rpi5\nram_mb: 4096\n")
    result = run_cli("profiles", "show", "rpi5", "--json", "--profiles-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ram_mb"] == 4096

    env = {**os.environ, profiles.PROFILES_ENV: str(tmp_path)}
    result = run_cli("profiles", "list", env=env)
    assert result.returncode == 0, result.stderr
    assert "4 GiB" in next(line for line in result.stdout.splitlines() if line.startswith("rpi5 "))


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    assert_clean_error(run_cli("profiles", "show", "rpi6"), "unknown board profile 'rpi6'", "rpi5")
    missing = str(tmp_path / "nope")
    assert_clean_error(run_cli("profiles", "list", "--profiles-dir", missing), "does not exist")

    text = edit(GOOD, "read_path", "read_path: odirekt")
    write(tmp_path, "tb", text)
    where = f"tb.yaml:{line_of(text, 'read_path')}: field 'engine.read_path'"
    result = run_cli("profiles", "show", "tb", "--profiles-dir", str(tmp_path))
    assert_clean_error(result, f"{where}: 'odirekt' is not one of pread, odirect")

    # `list` still prints every good board, then one error line per broken one, and exits 1.
    result = run_cli("profiles", "list", "--profiles-dir", str(tmp_path))
    assert "rpi5" in result.stdout and "tb " not in result.stdout
    assert_clean_error(result, where)


def test_cli_runner_show(tmp_path: Path) -> None:
    write(tmp_path, "tb", GOOD)
    result = CliRunner().invoke(app, ["profiles", "show", "tb", "--json", "--profiles-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "tb"
