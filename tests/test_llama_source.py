"""The pinned llama.cpp source: verified download, clean extraction, patches, idempotence."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bmoe_edge import llama_source
from bmoe_edge.llama_source import LlamaSourceError


@pytest.fixture(scope="module")
def tarball() -> Path:
    return llama_source.obtain_tarball(llama_source.read_pin())


@pytest.fixture()
def llama_dir(tmp_path: Path) -> Path:
    """A private copy of third_party/llama.cpp (PIN + patches) that a test may edit."""
    copy = tmp_path / "llama.cpp"
    copy.mkdir()
    shutil.copy(llama_source.LLAMA_DIR / "PIN", copy / "PIN")
    shutil.copytree(llama_source.LLAMA_DIR / "patches", copy / "patches")
    return copy


def test_pin_names_the_sdist_and_upstream_commit() -> None:
    pin = llama_source.read_pin()
    assert pin.package == "llama-cpp-python" and pin.version == "0.3.36"
    assert pin.sha256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    assert pin.upstream_commit == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def test_tampered_tarball_is_rejected_and_nothing_is_extracted(tmp_path: Path, tarball: Path,
                                                               llama_dir: Path) -> None:
    tampered = tmp_path / tarball.name
    shutil.copy(tarball, tampered)
    with open(tampered, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    dest = tmp_path / "out" / "src"
    with pytest.raises(LlamaSourceError, match="does not match the pin"):
        llama_source.fetch(dest, tarball=tampered, llama_dir=llama_dir)
    assert not dest.exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_fetch_extracts_patches_and_second_fetch_is_a_no_op(tmp_path: Path, tarball: Path,
                                                           llama_dir: Path) -> None:
    dest = tmp_path / "src"
    _, changed = llama_source.fetch(dest, tarball=tarball, llama_dir=llama_dir)
    assert changed
    header = (dest / llama_source.HOOK_HEADER).read_text()
    assert "ggml_cpu_set_expert_ready_hook" in header
    assert not dest.is_symlink()
    marker = dest / "marker"
    marker.write_text("kept")
    _, changed = llama_source.fetch(dest, tarball=tarball, llama_dir=llama_dir)
    assert not changed and marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama.cpp", "src"], "no staging dirs left"


def test_changed_patch_forces_a_clean_reextract(tmp_path: Path, tarball: Path, llama_dir: Path) -> None:
    dest = tmp_path / "src"
    llama_source.fetch(dest, tarball=tarball, llama_dir=llama_dir)
    (dest / "marker").write_text("stale")
    patch = next((llama_dir / "patches").glob("0001-*.patch"))
    patch.write_text(patch.read_text().replace("expert-ready hook.", "expert-ready hook (edited)."))
    _, changed = llama_source.fetch(dest, tarball=tarball, llama_dir=llama_dir)
    assert changed
    assert not (dest / "marker").exists()
    assert "expert-ready hook (edited)." in (dest / llama_source.HOOK_HEADER).read_text()


def test_patch_that_does_not_apply_leaves_the_old_tree(tmp_path: Path, tarball: Path,
                                                       llama_dir: Path) -> None:
    dest = tmp_path / "src"
    llama_source.fetch(dest, tarball=tarball, llama_dir=llama_dir)
    patch = next((llama_dir / "patches").glob("0001-*.patch"))
    patch.write_text(patch.read_text().replace("return g_state.numa.n_nodes > 1;", "return 0;"))
    with pytest.raises(LlamaSourceError, match="does not apply"):
        llama_source.fetch(dest, tarball=tarball, llama_dir=llama_dir)
    assert "ggml_cpu_set_expert_ready_hook" in (dest / llama_source.HOOK_HEADER).read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama.cpp", "src"]


def test_stock_tree_has_no_hook(tmp_path: Path, tarball: Path, llama_dir: Path) -> None:
    dest = tmp_path / "stock"
    llama_source.fetch(dest, patched=False, tarball=tarball, llama_dir=llama_dir)
    assert "ggml_cpu_set_expert_ready_hook" not in (dest / llama_source.HOOK_HEADER).read_text()


def test_tracked_llama_files_are_only_pin_patches_and_readme() -> None:
    import subprocess

    tracked = subprocess.run(
        ["git", "ls-files", "third_party"], cwd=llama_source.PROJECT_ROOT,
        capture_output=True, text=True, check=True,
    ).stdout.split()
    for path in tracked:
        assert path in ("third_party/llama.cpp/PIN", "third_party/llama.cpp/README.md") or (
            path.startswith("third_party/llama.cpp/patches/") and path.endswith(".patch")
        ), path
