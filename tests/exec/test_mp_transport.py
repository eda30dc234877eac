"""The shared-memory transport, driven in one process: a sender and a receiver on a pipe."""

from __future__ import annotations

import os
import pickle
import threading
from multiprocessing import Pipe
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mp_helpers
from chute._src.exec.mp.slabs import create_slab_fd, map_slab, plan_slabs
from chute._src.exec.mp.transport import (
    ALIGN,
    PIPE_BYTES,
    ResultReceiver,
    ResultSender,
    SlabAllocator,
)

SLAB = 1 << 20


@pytest.fixture
def link():
    """A sender and a receiver sharing one slab, as a worker and the main process do."""
    fd = create_slab_fd("/dev/shm", SLAB)
    worker_side, main_side = Pipe(duplex=True)
    sender = ResultSender(worker_side, map_slab(fd, SLAB))
    receiver = ResultReceiver(main_side, map_slab(fd, SLAB))
    os.close(fd)
    yield sender, receiver
    worker_side.close()
    main_side.close()


def roundtrip(sender: ResultSender, receiver: ResultReceiver, value: object) -> Any:
    # A thread sends, so that results larger than the pipe's buffer cannot block us.
    t = threading.Thread(target=sender.send_result, args=(0, value))
    t.start()
    message = receiver.recv()
    t.join()
    assert isinstance(message, tuple)
    return message[1]


def in_slab(array: np.ndarray, receiver: ResultReceiver) -> bool:
    """Whether `array`'s memory lies inside the receiver's slab (it is a zero-copy view)."""
    slab = np.frombuffer(receiver._slab, dtype=np.uint8)  # type: ignore[arg-type]
    start = slab.ctypes.data
    return start <= array.ctypes.data < start + slab.nbytes


def release(sender: ResultSender, receiver: ResultReceiver) -> None:
    """What the pool does on each put/get: hand freed region ids back to the worker."""
    while receiver.freed:
        sender.freed.append(receiver.freed.popleft())


def test_tree_roundtrip_keeps_types_values_and_layout(link) -> None:
    sender, receiver = link
    want = mp_helpers.tree(0, 1, 5)
    got = roundtrip(sender, receiver, want)
    assert isinstance(got, dict) and got.keys() == want.keys()
    for key in ("big", "fortran", "strided", "small", "empty"):
        np.testing.assert_array_equal(got[key], want[key])
        assert got[key].dtype == want[key].dtype
    assert got["fortran"].flags.f_contiguous
    assert list(got["objects"]) == ["a", None, 3]
    assert got["scalar"] == np.float32(5) and type(got["scalar"]) is np.float32
    np.testing.assert_array_equal(got["list"][0], want["list"][0])
    assert got["list"][1:] == ["text", b"bytes", 7]
    assert isinstance(got["pair"], mp_helpers.Pair) and got["pair"].right == (1, 2.5)
    assert isinstance(got["example"], mp_helpers.Example)
    np.testing.assert_array_equal(got["example"].image, want["example"].image)
    assert got["example"].extra == {"k": [1, 2]}
    # Contiguous arrays above the threshold are zero-copy views of the slab, and writable.
    assert in_slab(got["big"], receiver) and in_slab(got["example"].image, receiver)
    assert in_slab(got["fortran"], receiver) and in_slab(got["list"][0], receiver)
    assert not in_slab(got["small"], receiver)  # below the threshold: inside the pickle
    assert got["big"].flags.writeable
    for key in ("big", "fortran"):
        assert got[key].ctypes.data % ALIGN == 0


def test_region_is_not_reused_while_any_array_from_it_is_alive(link) -> None:
    sender, receiver = link
    first = roundtrip(sender, receiver, [np.full(1000, 1.0), np.full(1000, 2.0)])
    kept = first[1]
    del first
    for value in range(3, 200):  # far more data than the slab holds
        got = roundtrip(sender, receiver, np.full(1000, float(value)))
        assert got[0] == value
        del got
        release(sender, receiver)
    assert (kept == 2.0).all()
    assert in_slab(kept, receiver)
    # Only the region `kept` pins is live (the last freed id waits for the next allocation).
    assert sender.live_regions() - len(sender.freed) == 1


def test_region_is_freed_when_its_arrays_are_collected(link) -> None:
    sender, receiver = link
    got = roundtrip(sender, receiver, np.ones(SLAB // 16))
    view = got[::2]
    del got
    release(sender, receiver)
    assert not sender.freed  # the strided view still holds the region
    del view
    release(sender, receiver)
    assert list(sender.freed) == [0]


def test_full_slab_sends_copies_through_the_pipe(link) -> None:
    sender, receiver = link
    held = [roundtrip(sender, receiver, np.full(SLAB // 8 // 4, float(i))) for i in range(8)]
    assert sum(in_slab(a, receiver) for a in held) >= 3  # the slab held what it could
    assert not in_slab(held[-1], receiver)  # then copies took over
    for i, a in enumerate(held):
        assert (a == i).all()
        assert a.flags.writeable


def test_result_larger_than_the_slab_goes_through_the_pipe(link) -> None:
    sender, receiver = link
    big = np.arange(3 * SLAB // 8, dtype=np.float64)
    got = roundtrip(sender, receiver, {"big": big})
    np.testing.assert_array_equal(got["big"], big)
    assert not in_slab(got["big"], receiver)


def test_no_slab_uses_the_pipe() -> None:
    worker_side, main_side = Pipe(duplex=True)
    sender, receiver = ResultSender(worker_side, None), ResultReceiver(main_side, None)
    got = roundtrip(sender, receiver, mp_helpers.tree(0, 1, 2))
    np.testing.assert_array_equal(got["big"], mp_helpers.tree(0, 1, 2)["big"])


def test_error_travels_with_its_traceback(link) -> None:
    sender, receiver = link
    try:
        mp_helpers.fail_on(0, 1, 3)
    except mp_helpers.CustomError as e:
        sender.send_error(7, e)
    failure = receiver.recv()
    assert not isinstance(failure, tuple)
    assert failure.seq == 7 and failure.type_name == "CustomError"
    assert "in fail_on" in failure.traceback and "bad task 3" in failure.traceback


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), max_size=60))
def test_allocator_never_overlaps_and_coalesces_back(ops: list[tuple[bool, int]]) -> None:
    capacity = 64 * 256
    alloc = SlabAllocator(capacity)
    live: dict[int, tuple[int, int]] = {}
    for free_one, size in ops:
        if free_one and live:
            rid = min(live) if size % 2 else max(live)
            alloc.free(rid)
            del live[rid]
            continue
        got = alloc.allocate(size)
        if got is None:
            continue
        rid, offset = got
        end = offset + size
        assert offset % ALIGN == 0 and end <= capacity
        assert all(end <= s or offset >= e for s, e in live.values())
        live[rid] = (offset, end)
    for rid in list(live):
        alloc.free(rid)
    assert alloc.allocate(capacity) is not None  # all free space merged into one extent


def test_plan_grows_by_default_and_fixes_an_explicit_request_that_fits() -> None:
    default = plan_slabs(2, None, "/dev/shm", initial=1 << 20, limit=8 << 20)
    assert (default.initial_bytes, default.limit_bytes, default.warning) == (1 << 20, 8 << 20, None)
    fixed = plan_slabs(2, 1 << 20, "/dev/shm")
    assert (fixed.initial_bytes, fixed.limit_bytes) == (1 << 20, 1 << 20)
    assert plan_slabs(2, 0, "/dev/shm").limit_bytes == 0


def test_plan_refuses_or_shrinks_what_does_not_fit_and_says_how_to_fix_it() -> None:
    st_ = os.statvfs("/dev/shm")
    free = st_.f_bavail * st_.f_frsize
    refused = plan_slabs(2, free, "/dev/shm")
    assert refused.limit_bytes == 0
    assert refused.warning is not None and "--shm-size" in refused.warning
    shrunk = plan_slabs(4, None, "/dev/shm", initial=free // 8, limit=free)
    assert 0 < shrunk.limit_bytes * 4 <= free // 2
    assert shrunk.warning is not None and "shm_bytes_per_worker" in shrunk.warning
    crowded = plan_slabs(free // (1 << 20), None, "/dev/shm")  # < 1 MiB each
    assert crowded.limit_bytes == 0 and "too little" in (crowded.warning or "")
    missing = plan_slabs(2, None, "/nonexistent/dir")
    assert missing.limit_bytes == 0 and "shm_dir" in (missing.warning or "")


def test_slab_grows_for_large_results_and_old_arrays_stay_valid() -> None:
    fd = create_slab_fd("/dev/shm", SLAB)
    worker_side, main_side = Pipe(duplex=True)
    sender = ResultSender(
        worker_side, map_slab(fd, SLAB), grow_to=16 * SLAB, shm_dir="/dev/shm", headroom=4
    )
    receiver = ResultReceiver(main_side, map_slab(fd, SLAB))
    os.close(fd)
    small = roundtrip(sender, receiver, np.full(SLAB // 64, 1.0))  # fits 4 times: no growth
    assert receiver.slab_bytes == SLAB and in_slab(small, receiver)
    big = roundtrip(sender, receiver, np.full(SLAB // 8, 2.0))  # needs 4 MiB for 4
    assert receiver.slab_bytes == sender.slab_bytes == 4 * SLAB
    assert in_slab(big, receiver) and not in_slab(small, receiver)
    assert (small == 1.0).all() and (big == 2.0).all()
    huge = roundtrip(sender, receiver, np.full(3 * SLAB, 3.0))  # 24 MiB: more than grow_to
    assert not in_slab(huge, receiver) and (huge == 3.0).all()
    assert our_shm_entries() == []
    del small
    release(sender, receiver)
    roundtrip(sender, receiver, np.full(SLAB // 64, 4.0))  # the old slab is unmapped now
    assert sender._retired == {}
    worker_side.close()
    main_side.close()


def our_shm_entries() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith("chute_")]


def slab_offset(array: np.ndarray, receiver: ResultReceiver) -> int:
    slab = np.frombuffer(receiver._slab, dtype=np.uint8)  # type: ignore[arg-type]
    return int(array.ctypes.data - slab.ctypes.data)


def test_array_built_in_the_slab_is_sent_where_it_lies(link) -> None:
    sender, receiver = link
    built = sender.allocate_array((64, 128), np.dtype(np.float32))
    assert built is not None and built.flags.c_contiguous
    built[:] = np.arange(64 * 128, dtype=np.float32).reshape(64, 128)
    offset = int(built.ctypes.data - sender._current.address)
    got = roundtrip(sender, receiver, {"x": built, "y": np.ones(4096)})
    # no copy: the consumer's array is the very bytes the worker wrote
    assert slab_offset(got["x"], receiver) == offset
    assert in_slab(got["y"], receiver)  # the other array was copied into a region of its own
    np.testing.assert_array_equal(got["x"], built)
    # Handed over: freed only when both sides let go, in either order.
    del got
    release(sender, receiver)
    sender._release_freed()
    assert sender.live_regions() == 1  # the worker still holds `built`
    built[0, 0] = -1  # (it may even write: the region is still its own)
    del built
    sender._release_freed()
    assert sender.live_regions() == 0


def test_built_array_that_is_never_sent_is_freed_when_collected(link) -> None:
    sender, _ = link
    for _ in range(50):  # far more than the slab holds, were regions not freed
        built = sender.allocate_array((SLAB // 4,), np.dtype(np.uint8))
        assert built is not None
        del built
    sender._release_freed()
    assert sender.live_regions() == 0


def test_built_array_sent_twice_is_copied_the_second_time(link) -> None:
    sender, receiver = link
    built = sender.allocate_array((4096,), np.dtype(np.float64))
    assert built is not None
    built[:] = 7.0
    first = roundtrip(sender, receiver, built)
    second = roundtrip(sender, receiver, built)
    assert slab_offset(first, receiver) != slab_offset(second, receiver)
    assert (first == 7.0).all() and (second == 7.0).all()
    del first, second, built
    release(sender, receiver)
    sender._release_freed()
    assert sender.live_regions() == 0


def test_allocate_array_returns_none_when_the_slab_is_full(link) -> None:
    sender, receiver = link
    held = [sender.allocate_array((SLAB // 4,), np.dtype(np.uint8)) for _ in range(4)]
    assert all(a is not None for a in held)
    assert sender.allocate_array((SLAB // 4,), np.dtype(np.uint8)) is None
    # a result then falls back to a copy through the pipe, and still arrives intact
    got = roundtrip(sender, receiver, np.full(SLAB // 16, 3.0))
    assert (got == 3.0).all() and not in_slab(got, receiver)


def test_no_slab_means_no_built_arrays() -> None:
    worker_side, _ = Pipe(duplex=True)
    assert ResultSender(worker_side, None).allocate_array((10,), np.dtype(np.int8)) is None


def test_built_array_on_a_retired_slab_is_copied_into_the_new_one() -> None:
    fd = create_slab_fd("/dev/shm", SLAB)
    worker_side, main_side = Pipe(duplex=True)
    sender = ResultSender(
        worker_side, map_slab(fd, SLAB), grow_to=16 * SLAB, shm_dir="/dev/shm", headroom=4
    )
    receiver = ResultReceiver(main_side, map_slab(fd, SLAB))
    os.close(fd)
    old = sender.allocate_array((SLAB // 64,), np.dtype(np.float64))
    assert old is not None
    old[:] = 5.0
    grown = sender.allocate_array((SLAB // 8,), np.dtype(np.float64))  # grows the slab
    assert grown is not None and sender.slab_bytes == 4 * SLAB
    grown[:] = 6.0
    got = roundtrip(sender, receiver, [old, grown])
    assert (got[0] == 5.0).all() and (got[1] == 6.0).all()
    assert in_slab(got[0], receiver) and in_slab(got[1], receiver)  # both on the new slab
    del got, old, grown
    release(sender, receiver)
    sender._release_freed()
    assert sender.live_regions() == 0 and sender._retired == {}
    worker_side.close()
    main_side.close()


def test_outbuf_uses_the_installed_allocator_only_on_its_thread_and_for_large_arrays(link) -> None:
    from chute._src.core import outbuf

    sender, _ = link
    lo = sender._current.address
    hi = lo + sender.slab_bytes

    def shared(a: np.ndarray) -> bool:
        return lo <= a.ctypes.data < hi

    outbuf.install(sender.allocate_array)
    try:
        assert shared(outbuf.empty((outbuf.MIN_BYTES // 4,), np.float32))
        assert not shared(outbuf.empty(16, np.float32))  # small: private memory
        assert not shared(outbuf.empty(outbuf.MIN_BYTES, object))  # objects never
        rows = [np.full(outbuf.MIN_BYTES // 8, i, np.float64) for i in range(3)]
        batch = outbuf.stack(rows)
        assert shared(batch) and (batch[:, 0] == [0, 1, 2]).all()
        assert not shared(outbuf.stack([rows[0], rows[1].astype(np.float32)]))  # promoted
        other: list[np.ndarray] = []
        t = threading.Thread(target=lambda: other.append(outbuf.empty(outbuf.MIN_BYTES)))
        t.start()
        t.join()
        assert not shared(other[0])  # another thread: np.empty
    finally:
        outbuf.install(None)
    assert not shared(outbuf.empty((outbuf.MIN_BYTES,), np.uint8))


def test_a_result_that_still_fits_goes_first_and_the_slab_grows_after() -> None:
    """Making a larger slab (reserving and mapping headroom x the result) would hold up the
    first large result, which the consumer waits for: while the current slab holds it, it
    goes in that slab, and the larger slab is made once it is sent."""
    fd = create_slab_fd("/dev/shm", SLAB)
    worker_side, main_side = Pipe(duplex=True)
    sender = ResultSender(
        worker_side, map_slab(fd, SLAB), grow_to=16 * SLAB, shm_dir="/dev/shm", headroom=4
    )
    receiver = ResultReceiver(main_side, map_slab(fd, SLAB))
    os.close(fd)
    built = sender.allocate_array((SLAB // 32,), np.dtype(np.float64))  # a quarter
    assert built is not None and sender.slab_bytes == SLAB
    built[:] = 7.0
    first = roundtrip(sender, receiver, built)
    assert in_slab(first, receiver) and (first == 7.0).all()
    assert sender.slab_bytes == SLAB  # a quarter of the slab x headroom 4 fits exactly
    copied = roundtrip(sender, receiver, np.full(SLAB // 16, 8.0))  # half: wants 2 MiB
    assert in_slab(copied, receiver) and (copied == 8.0).all()  # in the 1 MiB slab
    assert sender.slab_bytes == 2 * SLAB  # then grown
    later = roundtrip(sender, receiver, np.full(SLAB // 16, 9.0))
    assert receiver.slab_bytes == sender.slab_bytes and in_slab(later, receiver)
    del first, copied, later, built
    release(sender, receiver)
    worker_side.close()
    main_side.close()


def test_a_large_pickle_goes_through_the_slab_and_is_freed_once_read(link) -> None:
    sender, receiver = link
    # Thousands of small arrays (each inside the pickle): a pickle of ~400 KiB, which
    # through the pipe would hold the worker until the main process reads it.
    value = [np.full(20, i, dtype=np.int32) for i in range(4000)]
    sender.send_result(0, value)  # no thread: it must not block on a full pipe
    header = receiver._conn.recv_bytes()
    kind, _, (payload, layout, payload_at) = pickle.loads(header)
    assert (kind, payload, layout) == ("ok", None, None) and len(header) < 1000
    first, _, length = payload_at
    assert length >= PIPE_BYTES and sender.live_regions() == 1
    # Through `recv`: the values, and the region given back as soon as they are read.
    sender.send_result(1, value)
    seq, got = receiver.recv()
    assert seq == 1 and all((a == b).all() for a, b in zip(got, value, strict=True))
    assert len(receiver.freed) == 1 and sender.live_regions() == 2
    sender.freed.extend([first, receiver.freed.popleft()])
    sender._release_freed()
    assert sender.live_regions() == 0


def test_a_large_pickle_that_does_not_fit_the_slab_goes_through_the_pipe(link) -> None:
    sender, receiver = link
    value = [np.full(20, i, dtype=np.int32) for i in range(12000)]  # > 1 MiB pickled
    got = roundtrip(sender, receiver, value)
    assert all((a == b).all() for a, b in zip(got, value, strict=True))
    assert sender.live_regions() == 0 and not receiver.freed
