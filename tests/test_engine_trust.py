"""The engine side of issue 27 (docs/integrity.md): the fault injector's environment variable only in
test builds, a storage that keeps hanging stops the engine with one line instead of pinning memory at
every timeout, and a model truncated while `dense=anon` runs is an error, never a signal."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from bmoe_edge.boards import bundle
from bmoe_edge.engine import Engine
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof import gates
from bmoe_edge.synthetic import tinymoe

from conftest import campaign_size

BASE = replace(gates.BASE, stream=True)
PROMPT = gates.PROMPTS[0]


def test_a_storage_that_keeps_hanging_stops_the_engine_in_one_line() -> None:
    """Every read from the 10th on stalls past the 1 s deadline: the decodes fail at the deadline, and
    after three in a row the engine stops — one line, and it stays stopped — instead of keeping another
    layer of slices pinned at every timeout (a server on such a disk grew until the OOM killer). One lane: the
    deadline is the storage's progress (a read started or done), and with several lanes a lane set free late
    by a previous run's stalled read starts its next one out of step with the others, so a batch of 1.5 s reads
    can keep progressing and land, which rightly counts as the storage answering (seen once under load)."""
    config = replace(BASE, io_timeout=1, fault="hang:10+", cache_mb=0, overlap=False, prefetch="off", io_threads=1)
    with Engine(tinymoe.fixture("qwen3moe", "Q8_0"), config) as engine:
        for _ in range(3):
            with pytest.raises(BmoeError, match="I/O deadline"):
                engine.run(PROMPT, 4)
        t0 = time.monotonic()
        for _ in range(2):
            with pytest.raises(BmoeError, match="the storage keeps hanging: 3 reads in a row") as exc:
                engine.run(PROMPT, 4)
            assert "\n" not in str(exc.value) and "open the model again" in str(exc.value)
        assert time.monotonic() - t0 < 1.0, "stopped at once, without waiting for another deadline"


def test_board_bundles_ignore_the_fault_environment_variable(qemu_bundle: Path) -> None:
    """BMOE_FAULT is read only by builds made for testing (BMOE_TEST_FAULTS, scripts/setup.sh): the board
    wheel has no getenv of it (the name, NUL-terminated, is not in its extension), the test build here has."""
    m = bundle.load_manifest(qemu_bundle)
    with zipfile.ZipFile(qemu_bundle / m.wheel) as wheel:
        ext = next(n for n in wheel.namelist() if n.startswith("bmoe_edge/_native") and n.endswith(".so"))
        board_so = wheel.read(ext)
    assert b"BMOE_FAULT\0" not in board_so
    import bmoe_edge._native as native_module

    assert b"BMOE_FAULT\0" in Path(native_module.__file__).read_bytes()


@pytest.mark.slow
def test_a_model_truncated_during_a_dense_anon_run_is_an_error_not_a_signal(tmp_path: Path) -> None:
    """With `dense=mmap` the dense weights are llama.cpp's mapping of the file: a truncation that lands
    inside a decode (after its identity check) faults on the next touch of a page past the new end —
    SIGBUS, the documented limit. `dense=anon` reads them into anonymous memory at open, so nothing of the
    file is mapped while decoding: a truncation at any moment is a failed read or a changed file, one line."""
    src = tinymoe.fixture("qwen3moe", "Q8_0")
    for trial in range(campaign_size(sample=1, full=10)):
        model = tmp_path / f"model-{trial}.gguf"
        shutil.copyfile(src, model)
        proc = subprocess.Popen([sys.executable, "-m", "bmoe_edge", "generate", "-m", str(model), "-p", PROMPT,
                                 "-n", "2000", "--dense", "anon", "--cache-mb", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        proc.stdout.read(1)               # the first token is out: decodes are running
        time.sleep(0.05 * trial)
        with model.open("r+b") as f:
            f.truncate(model.stat().st_size // 2)
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode != -signal.SIGBUS and proc.returncode > 0, (proc.returncode, err[-500:])
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert lines and lines[-1].startswith("error: ") and "Traceback" not in err, err[-800:]
