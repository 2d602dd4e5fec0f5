"""DeviceAllocator: ACL rounding and policies, best fit, split/merge, errors, stats, invariants."""

import gc
import itertools
import math
import pickle
import random
import weakref

import pytest

from simnpu.proto import codes
from simnpu.proto.errors import NotSupportedError, NpuError, NpuMemoryError
from simnpu.shm.allocator import _FREED_MEMORY, Allocation, DeviceAllocator

KiB = 1 << 10
MiB = 1 << 20
G = 2 * MiB  # default huge granule

HUGE_FIRST = codes.ACL_MEM_MALLOC_HUGE_FIRST
HUGE_ONLY = codes.ACL_MEM_MALLOC_HUGE_ONLY
NORMAL_ONLY = codes.ACL_MEM_MALLOC_NORMAL_ONLY


def size_for(reserved: int) -> int:
    """A request size whose normal reservation is exactly `reserved` (a multiple of 64)."""
    assert reserved % 64 == 0 and reserved >= 128
    return reserved - 64


def check_invariants(alloc: DeviceAllocator) -> None:
    """Live and free blocks tile [0, capacity) exactly, aligned, with free blocks coalesced."""
    cap = alloc.capacity
    live = alloc.snapshot()
    free = alloc.free_blocks()
    blocks = [(d["offset"], d["offset"] + d["reserved"], "live") for d in live]
    blocks += [(off, off + size, "free") for off, size in free]
    blocks.sort()
    assert blocks, "region has neither live nor free blocks"
    assert blocks[0][0] == 0
    assert blocks[-1][1] == cap
    for (s0, e0, k0), (s1, e1, k1) in itertools.pairwise(blocks):
        assert e0 == s1, f"gap or overlap between [{s0}, {e0}) and [{s1}, {e1})"
        assert not (k0 == k1 == "free"), f"adjacent free blocks at {s0} and {s1}"
    for s, e, _ in blocks:
        assert s % 64 == 0 and e > s
    reserved = sum(d["reserved"] for d in live)
    assert alloc.free_bytes == sum(size for _, size in free)
    assert alloc.free_bytes + reserved == cap
    assert alloc.largest_free_block == max((size for _, size in free), default=0)
    for d in live:
        assert d["reserved"] >= math.ceil(d["size"] / 32) * 32 + 32
        if d["huge"]:
            assert d["offset"] % G == 0
    by_owner: dict = {}
    for d in live:
        by_owner[d["owner"]] = by_owner.get(d["owner"], 0) + d["reserved"]
    assert alloc.usage_by_owner() == by_owner
    st = alloc.stats()
    assert st["num_free_blocks"] == len(free)
    assert st["allocated_bytes.all.current"] == reserved
    assert st["requested_bytes.all.current"] == sum(d["size"] for d in live)
    assert st["allocation.all.current"] == len(live)


# ------------------------------------------------------------------ rounding and alignment


@pytest.mark.parametrize(
    "size, reserved",
    [
        (1, 64),
        (31, 64),
        (32, 64),
        (33, 128),
        (64, 128),
        (96, 128),
        (97, 192),
        (100, 192),
        (4096, 4160),
    ],
)
def test_rounding_is_align32_plus_32_then_64(size, reserved):
    a = DeviceAllocator(1 * MiB)
    x = a.allocate(size, owner="c")
    assert (x.offset, x.size, x.reserved, x.owner, x.huge) == (0, size, reserved, "c", False)
    assert a.free_bytes == MiB - reserved


def test_starts_are_64_aligned_and_packed():
    a = DeviceAllocator(1 * MiB)
    sizes = [1, 33, 100, 7, 500, 64, 1000]
    xs = [a.allocate(s) for s in sizes]
    end = 0
    for x in xs:
        assert x.offset % 64 == 0
        assert x.offset == end  # best fit in one free block takes its start
        end = x.offset + x.reserved
    check_invariants(a)


@pytest.mark.parametrize("size", [0, -1, -4096])
def test_size_zero_or_negative_is_invalid_param(size):
    a = DeviceAllocator(1 * MiB)
    with pytest.raises(NpuError) as e:
        a.allocate(size)
    assert e.value.code == codes.ACL_ERROR_INVALID_PARAM == 100000
    assert a.free_bytes == MiB
    assert a.stats()["num_ooms"] == 0


def test_non_integer_size_is_invalid_param():
    a = DeviceAllocator(1 * MiB)
    with pytest.raises(NpuError) as e:
        a.allocate(1.5)  # type: ignore[arg-type]
    assert e.value.code == codes.ACL_ERROR_INVALID_PARAM


def test_unaligned_capacity_end_sliver_is_absorbed():
    a = DeviceAllocator(1000)
    x = a.allocate(900)  # 960 bytes after rounding; the 40 left over cannot hold a block
    assert x.reserved == 1000
    assert a.free_bytes == 0
    check_invariants(a)
    a.free(x.offset)
    assert a.free_blocks() == [(0, 1000)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity": 32},
        {"capacity": 1 * MiB, "huge_granule": 100},
        {"capacity": MiB, "huge_threshold": -1},
    ],
)
def test_bad_constructor_arguments(kwargs):
    with pytest.raises(NpuError) as e:
        DeviceAllocator(**kwargs)
    assert e.value.code == codes.ACL_ERROR_INVALID_PARAM


# ------------------------------------------------------------------ best fit, split, coalesce


def test_best_fit_takes_smallest_hole_that_fits():
    a = DeviceAllocator(1 * MiB)
    holes = {}
    for name, r in [
        ("h4k", 4096),
        ("s1", 128),
        ("h2k", 2048),
        ("s2", 128),
        ("h1k", 1024),
        ("s3", 128),
    ]:
        holes[name] = a.allocate(size_for(r))
    for name in ("h4k", "h2k", "h1k"):
        a.free(holes[name].offset)
    # 1.5 KiB fits the 2 KiB and 4 KiB holes and the big tail; best fit is the 2 KiB hole.
    x = a.allocate(size_for(1536))
    assert x.offset == holes["h2k"].offset
    # 1 KiB exactly fills the 1 KiB hole, not the 512-byte remainder of the 2 KiB one.
    y = a.allocate(size_for(1024))
    assert y.offset == holes["h1k"].offset
    # The 512-byte remainder of the 2 KiB hole now beats the 4 KiB hole.
    z = a.allocate(size_for(512))
    assert z.offset == holes["h2k"].offset + 1536
    check_invariants(a)


def test_best_fit_ties_go_to_lowest_address():
    a = DeviceAllocator(1 * MiB)
    xs = [a.allocate(size_for(1024)) for _ in range(6)]
    for i in (4, 0, 2):  # three equal 1 KiB holes, freed out of address order
        a.free(xs[i].offset)
    assert a.allocate(size_for(1024)).offset == xs[0].offset
    assert a.allocate(size_for(512)).offset == xs[2].offset
    check_invariants(a)


def test_split_leaves_remainder_free():
    a = DeviceAllocator(1 * MiB)
    x = a.allocate(size_for(4096))
    assert a.free_blocks() == [(4096, MiB - 4096)]
    a.free(x.offset)
    y = a.allocate(size_for(1024))
    assert a.free_blocks() == [(1024, MiB - 1024)]
    assert y.offset == 0


@pytest.mark.parametrize("fill", [False, True], ids=["with-free-tail", "region-full"])
def test_coalesce_in_every_free_order(fill):
    cap = 64 * KiB
    reserveds = [1024, 2048, 4096, 8192, 1024]
    if fill:
        reserveds.append(cap - sum(reserveds))
    for order in itertools.permutations(range(len(reserveds))):
        a = DeviceAllocator(cap)
        xs = [a.allocate(size_for(r), policy=NORMAL_ONLY) for r in reserveds]
        assert a.free_bytes == cap - sum(reserveds)
        for i in order:
            a.free(xs[i].offset)
            check_invariants(a)
        assert a.free_blocks() == [(0, cap)], order
        assert a.largest_free_block == cap


def test_merge_with_both_neighbours_at_once():
    a = DeviceAllocator(1 * MiB)
    x, y, z, w = (a.allocate(size_for(1024)) for _ in range(4))
    a.free(x.offset)
    a.free(z.offset)
    assert a.stats()["num_free_blocks"] == 3  # x, z, tail
    a.free(y.offset)
    assert a.free_blocks() == [(0, 3072), (4096, MiB - 4096)]
    a.free(w.offset)
    assert a.free_blocks() == [(0, MiB)]


# ------------------------------------------------------------------ lookup


def test_lookup_inside_outside_and_padding():
    a = DeviceAllocator(1 * MiB)
    x = a.allocate(100)  # bytes 0..99 requested, 100..191 padding
    y = a.allocate(1000)
    assert a.lookup(0) is x
    assert a.lookup(50) is x
    assert a.lookup(100) is x  # first padding byte
    assert a.lookup(x.reserved - 1) is x  # last padding byte
    assert a.lookup(x.reserved) is y
    assert a.lookup(y.offset + y.reserved - 1) is y
    assert a.lookup(y.offset + y.reserved) is None  # free space after y
    assert a.lookup(MiB - 1) is None
    assert a.lookup(MiB + 10) is None
    assert a.lookup(-1) is None
    a.free(x.offset)
    assert a.lookup(50) is None


# ------------------------------------------------------------------ policies


def test_huge_first_small_is_normal_large_is_granule_placed():
    a = DeviceAllocator(16 * MiB)
    small = a.allocate(100, policy=HUGE_FIRST)
    at_threshold = a.allocate(1 * MiB, policy=HUGE_FIRST)  # not > 1 MiB: normal
    big = a.allocate(1 * MiB + 1, policy=HUGE_FIRST)
    assert not small.huge and not at_threshold.huge
    assert at_threshold.reserved == MiB + 64
    assert big.huge
    assert big.offset % G == 0 and big.offset == G  # lowest aligned window after the normal blocks
    assert big.reserved == G
    three = a.allocate(3 * MiB, policy=codes.ACL_MEM_MALLOC_HUGE_FIRST_P2P)
    assert three.huge and three.reserved == 4 * MiB and three.offset == 2 * G
    # Padding counts: exactly 2 MiB asked is 2 MiB + 32 padded, so two granules.
    two = a.allocate(2 * MiB, policy=HUGE_FIRST)
    assert two.huge and two.reserved == 4 * MiB
    check_invariants(a)


def _unaligned_hole_only(policy_for_fillers=NORMAL_ONLY) -> DeviceAllocator:
    """8 MiB region whose only free block is [1 MiB, 3.5 MiB): 2.5 MiB, no aligned 2 MiB window."""
    a = DeviceAllocator(8 * MiB)
    a.allocate(size_for(1 * MiB), policy=policy_for_fillers, owner="f")
    hole = a.allocate(size_for(5 * MiB // 2), policy=policy_for_fillers, owner="f")
    a.allocate(size_for(8 * MiB - 7 * MiB // 2), policy=policy_for_fillers, owner="f")
    a.free(hole.offset)
    assert a.free_blocks() == [(1 * MiB, 5 * MiB // 2)]
    return a


def test_huge_first_falls_back_when_only_unaligned_space_is_left():
    a = _unaligned_hole_only()
    x = a.allocate(3 * MiB // 2, policy=HUGE_FIRST, owner="c")
    assert not x.huge
    assert x.offset == 1 * MiB
    assert x.reserved == 3 * MiB // 2 + 64
    assert a.stats()["num_ooms"] == 0
    check_invariants(a)


def test_huge_first_prefers_block_with_aligned_window_over_smaller_unaligned_one():
    a = DeviceAllocator(16 * MiB)
    a.allocate(size_for(1 * MiB), policy=NORMAL_ONLY)
    hole = a.allocate(size_for(5 * MiB // 2), policy=NORMAL_ONLY)  # [1, 3.5) MiB
    a.allocate(size_for(1 * MiB), policy=NORMAL_ONLY)  # [3.5, 4.5) MiB
    a.free(hole.offset)
    x = a.allocate(3 * MiB // 2, policy=HUGE_FIRST)
    assert x.huge
    assert x.offset == 6 * MiB  # first granule boundary in the tail block [4.5, 16) MiB
    # Normal placement would have used the smaller hole.
    y = a.allocate(3 * MiB // 2, policy=NORMAL_ONLY)
    assert y.offset == 1 * MiB
    check_invariants(a)


@pytest.mark.parametrize("policy", [HUGE_ONLY, codes.ACL_MEM_MALLOC_HUGE_ONLY_P2P])
def test_huge_only_fails_instead_of_falling_back(policy):
    a = _unaligned_hole_only()
    before = a.free_blocks()
    with pytest.raises(NpuMemoryError) as e:
        a.allocate(3 * MiB // 2, policy=policy)
    assert e.value.code == codes.ACL_ERROR_RT_MEMORY_ALLOCATION == 207001
    assert a.free_blocks() == before
    assert a.stats()["num_ooms"] == 1


@pytest.mark.parametrize("policy", [HUGE_ONLY, codes.ACL_MEM_MALLOC_HUGE_ONLY_P2P])
def test_huge_only_granule_places_any_size(policy):
    a = DeviceAllocator(16 * MiB)
    a.allocate(100)
    x = a.allocate(100, policy=policy)
    assert x.huge and x.reserved == G and x.offset == G
    check_invariants(a)


@pytest.mark.parametrize("policy", [NORMAL_ONLY, codes.ACL_MEM_MALLOC_NORMAL_ONLY_P2P])
def test_normal_only_never_granule_rounds(policy):
    a = DeviceAllocator(16 * MiB)
    first = a.allocate(100, policy=policy)
    x = a.allocate(3 * MiB, policy=policy)
    assert not x.huge
    assert x.offset == first.reserved  # right after, not on a granule boundary
    assert x.reserved == 3 * MiB + 64
    assert a.stats()["allocated_bytes.huge.current"] == 0
    check_invariants(a)


def _placements(policy: int) -> list[tuple[int, int, bool]]:
    a = DeviceAllocator(32 * MiB)
    return [
        (x.offset, x.reserved, x.huge)
        for x in (a.allocate(s, policy=policy) for s in (100, 3 * MiB, 5000))
    ]


@pytest.mark.parametrize("base", [HUGE_FIRST, HUGE_ONLY, NORMAL_ONLY])
@pytest.mark.parametrize(
    "flag",
    [
        codes.ACL_MEM_TYPE_LOW_BAND_WIDTH,
        codes.ACL_MEM_TYPE_HIGH_BAND_WIDTH,
        codes.ACL_MEM_ACCESS_USER_SPACE_READONLY,
    ],
)
def test_flag_bits_are_ignored(base, flag):
    assert _placements(base | flag) == _placements(base)


def test_policies_differ_on_this_sequence():
    # Guards the flag test above: it would be vacuous if all policies placed alike.
    assert len({tuple(_placements(p)) for p in (HUGE_FIRST, HUGE_ONLY, NORMAL_ONLY)}) == 3


@pytest.mark.parametrize("policy", [8, 0x42, 0xFF, 0x1000 | 0x99])
def test_unknown_policy_is_huge_first(policy):
    assert _placements(policy) == _placements(HUGE_FIRST)


@pytest.mark.parametrize(
    "policy",
    [
        codes.ACL_MEM_MALLOC_HUGE1G_ONLY,
        codes.ACL_MEM_MALLOC_HUGE1G_ONLY_P2P,
        codes.ACL_MEM_TYPE_HIGH_BAND_WIDTH | 6,
    ],
)
def test_huge1g_not_supported(policy):
    a = DeviceAllocator(16 * MiB)
    with pytest.raises(NotSupportedError) as e:
        a.allocate(4 * MiB, policy=policy)
    assert e.value.code == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT == 207000
    assert "1 GiB" in str(e.value)
    assert a.free_bytes == a.capacity
    assert a.stats()["num_ooms"] == 0


# ------------------------------------------------------------------ out of memory


def test_oom_message_names_sizes_policy_free_space_and_own_usage_not_other_users():
    a = DeviceAllocator(16 * MiB)
    a.allocate(size_for(6 * MiB), policy=NORMAL_ONLY, owner="alice")
    bob = a.allocate(size_for(2 * MiB), policy=NORMAL_ONLY, owner="bob")
    a.allocate(size_for(3 * MiB), policy=NORMAL_ONLY, owner="carol")
    a.free(bob.offset)  # free: 2 MiB hole + 5 MiB tail = 7 MiB, largest 5 MiB
    asked = 6 * MiB + 5
    with pytest.raises(NpuMemoryError) as e:
        a.allocate(asked, policy=HUGE_FIRST, owner="dave")
    err = e.value
    assert isinstance(err, MemoryError)
    assert err.code == 207001
    msg = err.message
    assert str(asked) in msg
    assert str(8 * MiB) in msg  # reserved as huge granules
    assert str(6 * MiB + 64) in msg  # reserved as normal memory on fallback
    assert "ACL_MEM_MALLOC_HUGE_FIRST" in msg
    assert f"free {7 * MiB} B" in msg
    assert f"largest free block {5 * MiB} B" in msg
    assert f"held by this client: 0 B, by 2 other client(s): {9 * MiB} B" in msg
    assert not [name for name in ("alice", "bob", "carol", "dave") if name in msg]
    top = a.top_users()  # who holds it: for the daemon's log
    assert f"'alice': {6 * MiB} B" in top and f"'carol': {3 * MiB} B" in top
    assert top.index("'alice'") < top.index("'carol'")  # biggest user first
    assert "'bob'" not in top and "'dave'" not in top
    assert a.stats()["num_ooms"] == 1
    # The error survives pickling (it crosses process boundaries in the daemon).
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.code, back.message) == (NpuMemoryError, 207001, msg)


def test_oom_counts_every_failure_and_changes_nothing():
    a = DeviceAllocator(4 * MiB)
    a.allocate(size_for(3 * MiB), policy=NORMAL_ONLY, owner="x")
    before = (a.free_blocks(), a.snapshot())
    for policy in (HUGE_FIRST, HUGE_ONLY, NORMAL_ONLY | codes.ACL_MEM_TYPE_HIGH_BAND_WIDTH):
        with pytest.raises(NpuMemoryError) as e:
            a.allocate(2 * MiB, policy=policy)
        assert codes.error_name(e.value.code) == "ACL_ERROR_RT_MEMORY_ALLOCATION"
    assert "ACL_MEM_MALLOC_NORMAL_ONLY | 0x1000" in e.value.message
    assert a.stats()["num_ooms"] == 3
    assert (a.free_blocks(), a.snapshot()) == before
    check_invariants(a)


def test_oom_with_enough_free_bytes_but_fragmented():
    a = DeviceAllocator(64 * KiB)
    xs = [a.allocate(size_for(1024), owner=i % 2) for i in range(64)]
    for x in xs[::2]:
        a.free(x.offset)
    assert a.free_bytes == 32 * KiB
    with pytest.raises(NpuMemoryError) as e:
        a.allocate(size_for(2048))
    assert "largest free block 1024 B" in e.value.message
    st = a.stats()
    assert st["fragmentation"] == pytest.approx(1 - 1024 / (32 * KiB))
    assert st["num_free_blocks"] == 32


# ------------------------------------------------------------------ bad free


def test_double_free():
    a = DeviceAllocator(1 * MiB)
    x = a.allocate(1000, owner="c")
    a.allocate(1000)
    assert a.free(x.offset) == x
    with pytest.raises(NpuError) as e:
        a.free(x.offset)
    assert e.value.code == codes.ACL_ERROR_RT_MEMORY_FREE == 207002
    assert "double free" in e.value.message
    check_invariants(a)


def test_free_of_interior_pointer():
    a = DeviceAllocator(1 * MiB)
    x = a.allocate(1000, owner="c")
    with pytest.raises(NpuError) as e:
        a.free(x.offset + 64)
    assert e.value.code == 207002
    assert "inside the allocation at 0x0" in e.value.message
    assert "double free" not in e.value.message
    assert a.lookup(x.offset) is x  # still live


def test_free_of_pointer_in_free_memory_or_outside_region():
    a = DeviceAllocator(1 * MiB)
    a.allocate(1000)
    with pytest.raises(NpuError) as e:
        a.free(4096)
    assert e.value.code == 207002
    assert "not the start of any allocation" in e.value.message
    for bad in (-64, MiB, 2 * MiB):
        with pytest.raises(NpuError) as e:
            a.free(bad)
        assert e.value.code == 207002
        assert "outside the device region" in e.value.message


def test_double_free_record_is_bounded_and_keeps_the_newest():
    a = DeviceAllocator(4 * MiB)
    old = a.allocate(100)
    a.allocate(100)  # keeps `old` from merging away into the tail
    a.free(old.offset)
    n = 3 * _FREED_MEMORY
    xs = [a.allocate(100) for _ in range(n)]
    for x in xs:
        a.free(x.offset)
    with pytest.raises(NpuError) as e:
        a.free(xs[-1].offset)
    assert "double free" in e.value.message  # recent: remembered
    with pytest.raises(NpuError) as e:
        a.free(old.offset)
    assert e.value.code == 207002
    assert (
        "double free" not in e.value.message
    )  # older than the record: still an error, less precise


def test_reallocated_start_can_be_freed_again():
    a = DeviceAllocator(1 * MiB)
    x = a.allocate(1000)
    a.free(x.offset)
    y = a.allocate(1000)
    assert y.offset == x.offset
    assert a.free(y.offset) == y


# ------------------------------------------------------------------ stats, snapshot, owners

STAT_KEYS = {
    *(
        f"allocated_bytes.{pool}.{k}"
        for pool in ("all", "huge", "normal")
        for k in ("current", "peak", "allocated", "freed")
    ),
    "requested_bytes.all.current",
    "requested_bytes.all.peak",
    "active_bytes.all.current",
    "active_bytes.all.peak",
    "reserved_bytes.all.current",
    *(f"allocation.all.{k}" for k in ("current", "peak", "allocated", "freed")),
    "num_alloc_retries",
    "num_ooms",
    "largest_free_block",
    "free_bytes",
    "num_free_blocks",
    "fragmentation",
    "capacity",
}


def test_stats_fresh():
    a = DeviceAllocator(16 * MiB)
    st = a.stats()
    assert set(st) == STAT_KEYS
    assert (
        st["reserved_bytes.all.current"]
        == st["capacity"]
        == st["free_bytes"]
        == st["largest_free_block"]
        == 16 * MiB
    )
    assert st["fragmentation"] == 0.0
    assert st["num_free_blocks"] == 1
    counters = [
        k
        for k in STAT_KEYS
        if k.startswith(("allocated", "requested", "active", "allocation", "num_"))
    ]
    counters.remove("num_free_blocks")
    assert len(counters) == 22
    assert {k: st[k] for k in counters} == dict.fromkeys(counters, 0)


def test_stats_peaks_and_counters():
    a = DeviceAllocator(32 * MiB)
    h = a.allocate(3 * MiB, owner="a")  # huge, 4 MiB
    n1 = a.allocate(1000, owner="a")  # normal, 1088
    n2 = a.allocate(5000, owner="b")  # normal, 5056
    a.free(h.offset)
    n3 = a.allocate(100, owner="b")  # normal, 192
    a.free(n1.offset)
    st = a.stats()
    assert st["allocated_bytes.huge.current"] == 0
    assert st["allocated_bytes.huge.peak"] == 4 * MiB
    assert st["allocated_bytes.huge.allocated"] == st["allocated_bytes.huge.freed"] == 4 * MiB
    assert st["allocated_bytes.normal.current"] == 5056 + 192
    assert st["allocated_bytes.normal.peak"] == 1088 + 5056 + 192
    assert st["allocated_bytes.normal.allocated"] == 1088 + 5056 + 192
    assert st["allocated_bytes.normal.freed"] == 1088
    assert st["allocated_bytes.all.current"] == 5056 + 192
    assert st["allocated_bytes.all.peak"] == 4 * MiB + 1088 + 5056
    assert st["allocated_bytes.all.allocated"] == 4 * MiB + 1088 + 5056 + 192
    assert st["allocated_bytes.all.freed"] == 4 * MiB + 1088
    assert st["active_bytes.all.current"] == st["allocated_bytes.all.current"]
    assert st["active_bytes.all.peak"] == st["allocated_bytes.all.peak"]
    assert st["requested_bytes.all.current"] == 5000 + 100
    assert st["requested_bytes.all.peak"] == 3 * MiB + 1000 + 5000
    assert st["allocation.all.current"] == 2
    assert st["allocation.all.peak"] == 3
    assert st["allocation.all.allocated"] == 4
    assert st["allocation.all.freed"] == 2
    assert st["num_alloc_retries"] == 0
    assert st["num_ooms"] == 0
    assert st["free_bytes"] == 32 * MiB - 5056 - 192
    assert st["fragmentation"] == pytest.approx(1 - st["largest_free_block"] / st["free_bytes"])
    assert 0 < st["fragmentation"] < 1
    check_invariants(a)
    for x in (n2, n3):
        a.free(x.offset)
    st = a.stats()
    assert st["allocated_bytes.all.current"] == 0 and st["fragmentation"] == 0.0
    assert st["allocated_bytes.all.allocated"] == st["allocated_bytes.all.freed"]


def test_fragmentation_zero_when_nothing_free():
    a = DeviceAllocator(64 * KiB)
    a.allocate(size_for(64 * KiB))
    st = a.stats()
    assert st["free_bytes"] == 0 and st["largest_free_block"] == 0
    assert st["fragmentation"] == 0.0
    assert st["num_free_blocks"] == 0


def test_snapshot_is_in_address_order():
    a = DeviceAllocator(1 * MiB)
    xs = [a.allocate(size_for(1024), owner=i) for i in range(4)]
    a.free(xs[1].offset)
    a.free(xs[0].offset)
    late = a.allocate(size_for(2048), owner="late")  # lands in the merged hole at 0
    assert late.offset == 0
    snap = a.snapshot()
    assert [d["offset"] for d in snap] == [0, 2048, 3072]
    assert snap[0] == {
        "offset": 0,
        "size": size_for(2048),
        "reserved": 2048,
        "owner": "late",
        "huge": False,
    }
    assert [d["owner"] for d in snap] == ["late", 2, 3]


def test_usage_by_owner():
    a = DeviceAllocator(32 * MiB)
    a1 = a.allocate(1000, owner="a")
    a2 = a.allocate(3 * MiB, owner="a")
    b1 = a.allocate(100, owner="b")
    assert a.usage_by_owner() == {"a": 1088 + 4 * MiB, "b": 192}
    a.free(b1.offset)
    usage = a.usage_by_owner()
    assert usage == {"a": 1088 + 4 * MiB}
    usage["a"] = 0  # a copy: does not touch the allocator
    a.free(a2.offset)
    assert a.usage_by_owner() == {"a": 1088}
    a.free(a1.offset)
    assert a.usage_by_owner() == {}


def test_an_owner_without_blocks_is_not_kept_alive():
    """Once an owner's last block is freed the allocator holds no reference to it (a session
    long gone stays alive with everything it held otherwise); a double free still names it."""

    class Client:
        def __repr__(self) -> str:
            return "client 7"

    a = DeviceAllocator(32 * MiB)
    owner = Client()
    blocks = [a.allocate(size, owner=owner) for size in (1000, 3 * MiB)]
    alive = weakref.ref(owner)
    del owner
    a.free(blocks[0].offset)
    assert alive() is not None  # one block left
    a.free(blocks[1].offset)
    blocks.clear()
    gc.collect()
    assert alive() is None, gc.get_referrers(alive())
    assert a.usage_by_owner() == {} and a.used_by(Client()) == 0
    with pytest.raises(NpuError, match="client 7"):
        a.free(0)


def test_allocation_is_immutable_value():
    x = Allocation(0, 1, 64, "o", False)
    assert x.end == 64
    with pytest.raises(AttributeError):
        x.offset = 5  # type: ignore[misc]


# ------------------------------------------------------------------ randomized property test


def _expected_placement(free, policy, size, granule):
    """Reference model: where best fit must put `size`, from the free list before the call."""
    base = policy & 0xFF
    mode = {1: "huge", 4: "huge", 2: "normal", 5: "normal"}.get(base, "first")
    padded = -(-size // 32) * 32 + 32
    normal = -(-padded // 64) * 64
    granules = -(-padded // granule) * granule
    if mode == "huge" or (mode == "first" and size > MiB):
        fits = [
            (sz, off) for off, sz in free if -(-off // granule) * granule + granules <= off + sz
        ]
        if fits:
            _, off = min(fits)
            return -(-off // granule) * granule, True
        if mode == "huge":
            return None
    fits = [(sz, off) for off, sz in free if sz >= normal]
    if fits:
        return min(fits)[1], False
    return None


@pytest.mark.parametrize("seed, capacity", [(1, 64 * MiB), (2, 64 * MiB), (3, 48 * MiB + 1000)])
def test_random_sequence_keeps_invariants_and_matches_best_fit(seed, capacity):
    rng = random.Random(seed)
    a = DeviceAllocator(capacity)
    live: list[Allocation] = []
    policies = [0, 0, 0, 1, 2, 2, 3, 4, 5, 0x1000 | 2, 0x100 | 0, 9]
    ooms = 0
    for _ in range(2000):
        if live and rng.random() < 0.45:
            x = live.pop(rng.randrange(len(live)))
            assert a.free(x.offset) == x
        else:
            if rng.random() < 0.75:
                size = int(math.exp(rng.uniform(0, math.log(MiB))))
            else:
                size = rng.randrange(MiB, 6 * MiB)
            policy = rng.choice(policies)
            free_before = a.free_blocks()
            expected = _expected_placement(free_before, policy, size, G)
            try:
                x = a.allocate(size, policy=policy, owner=rng.randrange(4))
            except NpuMemoryError:
                ooms += 1
                assert expected is None, f"OOM although {expected} was possible"
                assert a.free_blocks() == free_before
            else:
                assert (x.offset, x.huge) == expected
                live.append(x)
        check_invariants(a)
        for _ in range(3):
            p = rng.randrange(capacity)
            hit = a.lookup(p)
            brute = [y for y in live if y.offset <= p < y.offset + y.reserved]
            assert len(brute) <= 1
            assert hit is (brute[0] if brute else None)
    assert a.stats()["num_ooms"] == ooms
    assert ooms > 0, "sequence never filled the region; the OOM path went untested"
    for x in live:
        a.free(x.offset)
    assert a.free_blocks() == [(0, capacity)]
    st = a.stats()
    assert st["allocated_bytes.all.allocated"] == st["allocated_bytes.all.freed"]
    assert (
        st["allocation.all.allocated"]
        == st["allocation.all.freed"]
        == st["allocation.all.allocated"]
    )


# ------------------------------------------------------------------ per-owner limits (quotas)


def test_limit_caps_what_one_owner_may_reserve():
    a = DeviceAllocator(16 * MiB)
    a.allocate(size_for(3 * MiB), policy=NORMAL_ONLY, owner="a", limit=4 * MiB)
    assert a.used_by("a") == 3 * MiB
    before = (a.free_blocks(), a.snapshot())
    with pytest.raises(NpuMemoryError) as e:
        a.allocate(size_for(2 * MiB), policy=NORMAL_ONLY, owner="a", limit=4 * MiB)
    assert e.value.code == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
    msg = e.value.message
    assert "memory limit" in msg and f"may reserve {4 * MiB} B" in msg
    assert f"already holds {3 * MiB} B" in msg
    assert (a.free_blocks(), a.snapshot()) == before
    assert a.stats()["num_ooms"] == 1
    # Exactly up to the limit is allowed; another owner is not limited by a's limit.
    a.allocate(size_for(1 * MiB), policy=NORMAL_ONLY, owner="a", limit=4 * MiB)
    assert a.used_by("a") == 4 * MiB
    a.allocate(size_for(8 * MiB), policy=NORMAL_ONLY, owner="b", limit=8 * MiB)
    check_invariants(a)


def test_device_oom_under_a_limit_does_not_blame_the_limit():
    a = DeviceAllocator(4 * MiB)
    a.allocate(size_for(3 * MiB), policy=NORMAL_ONLY, owner="big")
    with pytest.raises(NpuMemoryError) as e:
        a.allocate(size_for(2 * MiB), policy=NORMAL_ONLY, owner="a", limit=1 << 30)
    assert "memory limit" not in e.value.message
    assert f"by 1 other client(s): {3 * MiB} B" in e.value.message  # another owner holds it


def test_limit_turns_huge_first_into_normal_when_granules_do_not_fit_it():
    a = DeviceAllocator(32 * MiB)
    x = a.allocate(3 * MiB, policy=HUGE_FIRST, owner="a", limit=3 * MiB + 64)
    assert not x.huge and x.reserved == 3 * MiB + 64  # 4 MiB of granules would pass the limit
    y = a.allocate(3 * MiB, policy=HUGE_FIRST, owner="b", limit=4 * MiB)
    assert y.huge and y.reserved == 4 * MiB
    with pytest.raises(NpuMemoryError) as e:
        a.allocate(3 * MiB, policy=HUGE_ONLY, owner="c", limit=3 * MiB + 64)
    assert "memory limit" in e.value.message
    check_invariants(a)


def test_used_by_follows_allocations_and_frees():
    a = DeviceAllocator(16 * MiB)
    assert a.used_by("x") == 0
    xs = [a.allocate(1000, owner="x") for _ in range(3)]
    assert a.used_by("x") == 3 * 1088
    for x in xs:
        a.free(x.offset)
    assert a.used_by("x") == 0
    assert a.usage_by_owner() == {}


def test_lookup_of_blocks_spanning_many_index_pages():
    a = DeviceAllocator(64 * MiB)
    small = a.allocate(100, policy=NORMAL_ONLY)
    big = a.allocate(size_for(10 * MiB + 64), policy=NORMAL_ONLY)  # starts mid-page
    after = a.allocate(100, policy=NORMAL_ONLY)
    for probe in (big.offset, big.offset + MiB, big.offset + 5 * MiB + 17, big.end - 1):
        assert a.lookup(probe) is big
    assert a.lookup(small.offset + 1) is small
    assert a.lookup(big.end) is after
    a.free(big.offset)
    for probe in (big.offset, big.offset + 5 * MiB, big.end - 1):
        assert a.lookup(probe) is None
    assert a.lookup(after.offset) is after
    check_invariants(a)


def test_page_alignment_gives_every_block_whole_pages():
    """The daemon's devices align blocks to the 4 KiB page: no two blocks share one."""
    allocator = DeviceAllocator(1 << 22, align=4096)
    blocks = [allocator.allocate(size) for size in (1, 100, 4064, 4065, 5000, 1 << 20)]
    for block in blocks:
        assert block.offset % 4096 == 0 and block.reserved % 4096 == 0
    assert [block.reserved for block in blocks[:5]] == [4096, 4096, 4096, 8192, 8192]
    pages = [set(range(b.offset // 4096, (b.offset + b.reserved) // 4096)) for b in blocks]
    assert sum(map(len, pages)) == len(set().union(*pages))


@pytest.mark.parametrize("align", [32, 100, 4097])
def test_alignment_must_be_a_power_of_two_of_at_least_64(align):
    with pytest.raises(NpuError) as error:
        DeviceAllocator(1 << 20, align=align)
    assert error.value.code == codes.ACL_ERROR_INVALID_PARAM
