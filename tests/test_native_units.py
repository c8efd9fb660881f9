"""Unit tests of the engine's C++ rooms through their test bindings: the cache policy, the mirror's
unit reference counting over the recycled page pool, expert-name parsing."""

from __future__ import annotations

import os
import random
import struct
from itertools import pairwise
from pathlib import Path

import pytest

from bmoe_edge.engine import native

T = native.load().parts
PAGE = os.sysconf("SC_PAGESIZE")


# --- the cache policy -------------------------------------------------------------------------

def _cache(budget_experts_per_layer: float, layers: int = 4, n_expert: int = 16, size: int = 100,
           ranking: str = "frequency"):
    return T.ExpertCache(int(budget_experts_per_layer * layers * size), [size] * layers, [n_expert] * layers,
                         ranking)


def test_the_budget_becomes_an_equal_share_of_experts_per_layer() -> None:
    assert _cache(0).per_layer == 0
    assert _cache(0.99).per_layer == 0  # below one expert of every layer: it could never hit
    assert _cache(1).per_layer == 1
    assert _cache(5.5).per_layer == 5
    c = T.ExpertCache(1000, [100, 0, 300], [8, 0, 8])  # a layer without experts takes no share
    assert c.per_layer == 2


def test_lru_within_a_layer_and_the_pinned_layer_is_never_a_victim() -> None:
    c = _cache(2, ranking="lru")  # the cache before issue 30 (frequency: native/tests/test_expert_cache.cpp)
    for e in (1, 2, 3):
        c.insert(0, e)
    assert c.evict_over_budget(0) == []  # layer 0 is being computed
    assert c.evict_over_budget(1) == [(0, 1)]  # then its least recent goes
    assert c.touch(0, 2) and not c.touch(0, 1)
    c.insert(0, 4)
    assert c.evict_over_budget(-1) == [(0, 3)]  # 2 was touched after 3
    assert len(c) == 2 and c.resident_bytes == 200


def test_a_cyclic_token_loop_still_hits_with_a_budget_below_one_token() -> None:
    """One global LRU hits 0% when the budget is below a token's routed experts (every layer is
    visited in turn); equal per-layer shares keep hitting at about share / n_expert."""
    layers, n_expert, routed = 8, 16, 4
    c = _cache(2, layers=layers, n_expert=n_expert)  # 2 of 16 per layer: far below 4 routed x 8 layers
    rng = random.Random(1)
    hits = lookups = 0
    for token in range(400):
        for layer in range(layers):
            for e in rng.sample(range(n_expert), routed):
                lookups += 1
                if c.touch(layer, e):
                    hits += 1 if token >= 20 else 0
                else:
                    c.insert(layer, e)
            c.evict_over_budget(layer)
    rate = hits / (lookups * 380 / 400)
    assert 0.08 < rate < 0.2, rate  # ~ 2/16 on uniform routing


def test_a_smaller_budget_evicts_down_to_the_new_share() -> None:
    c = _cache(4)
    for layer in range(4):
        for e in range(4):
            c.insert(layer, e)
    c.set_budget(1 * 4 * 100)
    victims = c.evict_over_budget(-1)
    assert len(victims) == 12 and len(c) == 4
    c.evict_layer(2, [3, 9])  # a failed read: forgotten, unknown ids ignored
    assert len(c) == 3


# --- the mirror and its page pool ---------------------------------------------------------------

@pytest.mark.parametrize("unit_kb", [PAGE // 1024, 16, 64])
def test_mirror_units_are_shared_by_neighbours_and_recycled(unit_kb: int) -> None:
    unit = unit_kb * 1024
    m = T.Mirror(file_size=40 * unit + 123, unit=unit)
    a = (unit // 2, 2 * unit)  # units 0..2
    b = (a[0] + a[1], unit)    # starts inside unit 2: shares it with a
    m.acquire(*a)
    m.write(a[0], b"A" * a[1])
    m.acquire(*b)
    m.write(b[0], b"B" * b[1])
    assert m.references(2 * unit) == 2 and m.resident_bytes == 4 * unit
    m.release(*a)  # the shared unit stays: b still covers it
    assert m.references(2 * unit) == 1 and m.read(b[0], b[1]) == b"B" * b[1]
    assert m.resident_bytes == 2 * unit and m.pool_units_in_use == 2
    # The freed units are reused, not grown (the pool grows a huge page's worth at a time, at most
    # what the mirror can hold).
    size = m.pool_size_units
    assert 4 <= size <= 41
    m.acquire(30 * unit, 2 * unit)
    assert m.pool_size_units == size and m.pool_units_in_use == 4
    m.write(30 * unit, b"C" * (2 * unit))
    assert m.read(b[0], b[1]) == b"B" * b[1]  # a recycled unit never aliases a resident one
    m.release(*b)
    m.release(30 * unit, 2 * unit)
    assert m.resident_bytes == 0 and m.pool_units_in_use == 0
    assert m.pool_held_units == size
    m.trim()  # memory pressure: the kept pages go back to the kernel
    assert m.pool_held_units == 0
    m.acquire(0, 40 * unit + 123)  # the whole file, the last unit partial
    m.write(40 * unit, b"z" * 123)
    assert m.read(40 * unit, 123) == b"z" * 123
    m.release(0, 40 * unit + 123)


def _vmstat(*keys: str) -> list[int]:
    values = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return [int(values.get(k, 0)) for k in keys]


def _frames(address: int, pages: int) -> list[int]:
    """The physical page numbers behind `pages` pages at `address` (/proc/self/pagemap; 0 without root)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(address // PAGE * 8)
        return [v & ((1 << 55) - 1) for v in struct.unpack(f"<{pages}Q", f.read(8 * pages))]


def test_a_slice_gets_physically_contiguous_pages_where_the_kernel_has_huge_pages() -> None:
    """The pool grows in huge pages, so a slice's O_DIRECT read is a few DMA segments, not one per
    page (a virtualized disk pays per segment: docs/memory.md)."""
    if "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text() or os.geteuid() != 0:
        pytest.skip("needs transparent huge pages and root (physical page numbers)")
    slice_bytes = 648 * 1024
    m = T.Mirror(file_size=64 << 20, unit=PAGE)
    before = _vmstat("thp_fault_alloc", "thp_fault_fallback")
    m.acquire(3 * PAGE, slice_bytes)
    after = _vmstat("thp_fault_alloc", "thp_fault_fallback")
    if after[0] == before[0]:
        pytest.skip(f"the kernel had no huge page to give (fallbacks {after[1] - before[1]})")
    frames = _frames(m.base_address + 3 * PAGE, slice_bytes // PAGE)
    assert all(frames)
    runs = 1 + sum(1 for a, b in pairwise(frames) if b != a + 1)
    assert runs <= 2, runs  # one huge page, or the boundary of two
    m.release(3 * PAGE, slice_bytes)


def test_trim_frees_the_pages_of_a_huge_page_whose_other_pages_hold_a_slice() -> None:
    """A slice moved into the mirror keeps its huge page alive: trimming the free units beside it
    unmapped their pages and freed none, the kernel queued the huge page for a deferred split and the
    cgroup kept charging all of it (103-144 MiB the budget could not give the cache, under a 1107 MiB
    cap: bench-data/2026-12-02/long-prompt-3). Trimmed pages must be no huge page's any more."""
    if "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text() or os.geteuid() != 0:
        pytest.skip("needs transparent huge pages and root (physical page numbers, /proc/kpageflags)")
    m = T.Mirror(file_size=64 << 20, unit=PAGE)
    before = _vmstat("thp_fault_alloc")
    kept, spare = (0, 256 * 1024), (256 * 1024, 256 * 1024)
    m.acquire(*kept)
    m.acquire(*spare)
    if _vmstat("thp_fault_alloc") == before:
        pytest.skip("the kernel had no huge page to give")
    m.write(kept[0], b"K" * kept[1])
    frames = _frames(m.base_address + spare[0], spare[1] // PAGE)
    assert all(frames)
    m.release(*spare)  # its pages go home to the pool, free units beside the kept slice's
    m.trim()
    in_a_huge_page = (1 << 15) | (1 << 16) | (1 << 22)   # KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL, KPF_THP
    with open("/proc/kpageflags", "rb") as f:
        still = 0
        for frame in frames:
            f.seek(frame * 8)
            still += bool(struct.unpack("<Q", f.read(8))[0] & in_a_huge_page)
    assert still == 0, f"{still} of {len(frames)} trimmed pages are still part of a huge page"
    assert m.read(*kept) == b"K" * kept[1]   # the split moved nothing under the kept slice
    m.release(*kept)


def test_trim_keeps_the_pages_the_budget_has_room_for_and_reserve_faults_them_in_ahead() -> None:
    """A budget moved for a prompt's compute buffer trims the pool down to the new budget, not to nothing:
    trimming every free unit made the same prompt fault its pages in again on the eval thread (at 420 MB/s
    for a VM's fresh memory: bench-data/2026-12-02/ttft-warm). reserve() faults pages in ahead, in
    steps, up to a target, reusing trimmed free units before it grows the pool."""
    m = T.Mirror(file_size=64 << 20, unit=PAGE)
    m.set_huge_pages(False)
    m.acquire(0, 40 * PAGE)
    m.release(0, 40 * PAGE)
    assert m.pool_held_units == 40 and m.pool_units_in_use == 0
    assert m.trim(keep_units=25) == 15 and m.pool_held_units == 25
    assert m.trim(keep_units=30) == 0 and m.pool_held_units == 25   # below the target already: nothing
    left = m.reserve(target_units=60, step_units=10)                 # the 15 trimmed units first, in steps
    assert (left, m.pool_held_units, m.pool_size_units) == (25, 35, 40)
    while m.reserve(target_units=60, step_units=10):
        pass
    assert (m.pool_held_units, m.pool_size_units) == (60, 60)        # then growth, to the target exactly
    m.acquire(0, 60 * PAGE)                                          # taken without growing the pool
    assert (m.pool_size_units, m.pool_held_units, m.pool_units_in_use) == (60, 60, 60)
    m.release(0, 60 * PAGE)
    assert m.trim() == 60 and m.pool_held_units == 0                 # keep 0: every free unit, as before


def test_a_pool_without_huge_pages_grows_a_unit_at_a_time() -> None:
    """A cache that holds every expert (the engine's choice) needs no contiguity: no overshoot."""
    m = T.Mirror(file_size=64 << 20, unit=PAGE)
    m.set_huge_pages(False)
    m.acquire(PAGE, 5 * PAGE)
    assert m.pool_size_units == 5 and m.pool_held_units == 5
    m.set_huge_pages(True)  # growth rounds up to a whole huge page again
    m.acquire(10 * PAGE, PAGE)
    chunk = _pool_chunk_units(PAGE)
    assert m.pool_size_units == (chunk if chunk > 1 else 6)


def test_mirror_refuses_to_release_what_it_never_held() -> None:
    m = T.Mirror(file_size=8 * PAGE, unit=PAGE)
    m.acquire(0, PAGE)
    m.release(0, PAGE)
    with pytest.raises(Exception, match="released more often than acquired"):
        m.release(0, PAGE)


def test_random_admit_and_evict_keeps_every_resident_byte() -> None:
    """Slices of odd sizes at odd offsets, admitted before the victims are released (the streamer's
    order): every resident slice keeps its own bytes through all the recycling."""
    unit = 16 * 1024
    size = 3000 * 1000
    m = T.Mirror(file_size=size, unit=unit)
    rng = random.Random(7)
    slices = [(i * 30_000 + 77, 30_000) for i in range(size // 30_000 - 1)]
    resident: dict[int, bytes] = {}
    peak = 0
    for step in range(300):
        admit = rng.sample(range(len(slices)), 4)
        for i in admit:
            if i not in resident:
                m.acquire(*slices[i])
                data = bytes([step % 251 + 1]) * slices[i][1]
                m.write(slices[i][0], data)
                resident[i] = data
        assert m.pool_units_in_use * unit == m.resident_bytes
        peak = max(peak, m.pool_units_in_use)
        for i in [k for k in resident if k not in admit and rng.random() < 0.5]:
            m.release(*slices[i])
            del resident[i]
        for i, data in resident.items():
            assert m.read(*slices[i]) == data
    # Free units are reused before the pool grows, and it grows a huge page's worth at a time.
    assert peak <= m.pool_size_units < peak + _pool_chunk_units(unit)


def _pool_chunk_units(unit: int) -> int:
    try:
        huge = int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 1
    return huge // unit if huge > unit and huge <= 32 << 20 else 1


# --- expert names ---------------------------------------------------------------------------------

def test_expert_names_parse_by_the_recipe() -> None:
    suffixes = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
    assert T.parse_expert_name("blk.12.ffn_up_exps.weight", suffixes) == (12, 1)
    assert T.parse_expert_name("blk.0.ffn_down_exps.weight", suffixes) == (0, 2)
    for name in ("blk.1.ffn_up_exps.bias", "blk.x.ffn_up_exps.weight", "blk..ffn_up_exps.weight",
                 "blk.1.ffn_up_shexp.weight", "output.weight", "blk.1.weight",
                 "blk.99999999999.ffn_up_exps.weight"):  # a lying file's layer number: not one, no throw
        assert T.parse_expert_name(name, suffixes) is None, name
