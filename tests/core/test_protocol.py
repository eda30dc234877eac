"""The node protocol the engine walks: roles, parents, `with_parents`, `children()`."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

import chute
from chute._src.core import contract
from chute.testing import assert_equal_output_after_checkpoint


def _double(x: int) -> int:
    return 2 * x


def _add_draw(x: int, rng: Any) -> int:
    return x + int(rng.integers(0, 1000))


def test_stages_declare_their_role() -> None:
    src = chute.MapDataset.range(10)
    stream = src.to_iter_dataset()
    roles = {
        "source": src,
        "reader": stream,
        "element_wise": stream.map(_double),
        "order_dependent": stream.batch(2),
        "pass_through": stream.seed(3),
        "prefetch": stream.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)),
    }
    for role, ds in roles.items():
        assert contract.role(ds).value == role, ds
    assert contract.role(stream.filter(bool)).value == "element_wise"
    assert contract.role(stream.map_with_index(lambda i, x: x)).value == "order_dependent"
    assert contract.role(src.seed(1)).value == "pass_through"
    # With no workers, mp_prefetch hands its input on and does no work.
    none = stream.mp_prefetch(chute.MultiprocessingOptions(num_workers=0))
    assert contract.role(none).value == "pass_through"
    prefetch = chute.experimental.ThreadPrefetchIterDataset(stream, prefetch_buffer_size=0)
    assert contract.role(prefetch).value == "pass_through"


def test_element_wise_stages_give_their_map_stage() -> None:
    src = chute.MapDataset.range(10)
    stream = src.to_iter_dataset().map(_double).filter(lambda x: x % 4)
    moved = contract.element_wise(stream.parents[0])._as_map_stage(src)
    assert [moved[i] for i in range(3)] == [0, 2, 4]
    kept = contract.element_wise(stream)._as_map_stage(moved)
    assert list(kept.to_iter_dataset()) == list(stream)
    with pytest.raises(NotImplementedError, match="not element-wise"):
        stream.batch(2)._as_map_stage(src)


def test_the_contract_stays_out_of_the_users_namespace() -> None:
    # What users see on the dataset types: operations (and Grain's `parents`).
    engine_names = {
        "role", "internal", "reads_shards", "concurrent", "with_parents", "for_workers",
        "cache_identity", "position_params", "as_map_stage", "identity", "fingerprint",
        "make_iterator", "stage_name", "allow_nones", "with_executor", "data_source",
    }  # fmt: skip
    for cls in (chute.MapDataset, chute.IterDataset):
        assert engine_names.isdisjoint(dir(cls)), engine_names & set(dir(cls))
    assert {"map", "filter", "batch", "shuffle", "parents"} <= set(dir(chute.MapDataset))


def test_an_element_wise_stage_missing_its_contract_is_named() -> None:
    from chute._src.core.contract import StageRole

    class Half(chute.IterDataset[int]):  # declares the role but not what it promises
        _role = StageRole.ELEMENT_WISE

        def __iter__(self):
            return iter(cast(chute.IterDataset[int], self.parents[0]))

    half = Half(chute.MapDataset.range(4).to_iter_dataset())
    with pytest.raises(
        TypeError, match=r"Half declares the role ELEMENT_WISE but lacks _stage_name"
    ):
        contract.element_wise(half)
    with pytest.raises(TypeError, match="lacks _stage_name"):
        list(half.mp_prefetch(chute.MultiprocessingOptions(num_workers=1)))


def test_with_parents_rebuilds_a_stage_on_equivalent_parents() -> None:
    a = chute.MapDataset.range(20)
    b = chute.MapDataset.source(list(range(20)))
    ds = a.shuffle(seed=4).map(_double)
    shuffled = cast(chute.MapDataset[int], ds.parents[0])
    rebuilt = contract.with_parents(shuffled, [b])
    assert rebuilt.parents == (b,) and shuffled.parents == (a,)
    assert [rebuilt[i] for i in range(20)] == [shuffled[i] for i in range(20)]
    assert contract.fingerprint(rebuilt) == contract.fingerprint(
        shuffled
    )  # the same stage, equivalent inputs
    with pytest.raises(ValueError, match=r"got 2 parents, but the stage has 1"):
        contract.with_parents(shuffled, [a, b])


class _Stretched(chute.MapDataset[int]):
    """A user's stage (Grain's form) that derives its length from its parent."""

    def __init__(self, parent: chute.MapDataset[int], times: int) -> None:
        super().__init__(parent)
        self.times = times
        self.length = len(parent) * times

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:  # type: ignore[override]
        return cast(chute.MapDataset[int], self.parents[0])[index // self.times]


def test_with_parents_builds_the_stage_again_on_the_new_parents() -> None:
    short = _Stretched(chute.MapDataset.range(3), times=2)
    assert len(short) == 6
    # What __init__ derived from the parent is derived again from the new one: a copy
    # would have kept the old length (6) over a parent of 5.
    rebuilt = contract.with_parents(short, [chute.MapDataset.source([7, 8, 9, 10, 11])])
    assert type(rebuilt) is _Stretched and rebuilt.times == 2 and len(rebuilt) == 10
    assert [rebuilt[i] for i in range(10)] == [7, 7, 8, 8, 9, 9, 10, 10, 11, 11]
    assert len(short) == 6 and short.parents[0] is not rebuilt.parents[0]


def test_a_rebuilt_stage_keeps_its_seed_and_identity_wherever_its_parents_sit() -> None:
    # The pipeline seed is keyed by the stage's depth; a rewrite that puts a stage over
    # deeper parents (timing wrappers, stand-ins) must not change its draws.
    seeded = chute.MapDataset.range(50).seed(11)
    shuffled = seeded.shuffle()
    deeper = seeded.map(lambda x: x).map(lambda x: x)
    rebuilt = contract.with_parents(shuffled, [deeper])
    assert [rebuilt[i] for i in range(50)] == [shuffled[i] for i in range(50)]
    assert contract.identity(rebuilt) == contract.identity(shuffled)
    fresh = deeper.shuffle()  # the same stage built by hand there draws otherwise
    assert [fresh[i] for i in range(50)] != [shuffled[i] for i in range(50)]
    # The same for a seed found by searching upstream (random_map's, as Grain's).
    drawn = seeded.random_map(_add_draw)
    redrawn = contract.with_parents(drawn, [deeper])
    assert [redrawn[i] for i in range(50)] == [drawn[i] for i in range(50)]
    assert [deeper.random_map(_add_draw)[i] for i in range(50)] != [drawn[i] for i in range(50)]


def test_a_stage_that_makes_its_own_parents_is_copied_onto_new_ones() -> None:
    class Numbers(chute.MapDataset[int]):
        def __init__(self, n: int) -> None:
            super().__init__(chute.MapDataset.range(n))  # no parent among its arguments

        def __len__(self) -> int:
            return len(cast(chute.MapDataset[int], self.parents[0]))

        def __getitem__(self, index: int) -> int:  # type: ignore[override]
            return cast(chute.MapDataset[int], self.parents[0])[index] * 10

    ds = Numbers(4)
    moved = contract.with_parents(ds, [chute.MapDataset.source([1, 2, 3, 4])])
    assert type(moved) is Numbers and [moved[i] for i in range(4)] == [10, 20, 30, 40]


def test_iterators_expose_their_children() -> None:
    a = chute.MapDataset.range(4).to_iter_dataset()
    b = chute.MapDataset.range(10, 14).to_iter_dataset()
    it = iter(chute.IterDataset.mix([a.map(_double), b]).batch(2))
    top = it.children()[0]  # iter(ds) wraps the top stage in a thread guard
    assert top.stage == "batch"
    (mix,) = top.children()
    assert mix.stage == "mix"
    assert [c.stage for c in mix.children()] == ["map", "to_iter_dataset"]
    assert mix.children()[1].children() == ()


def test_close_and_start_prefetch_reach_every_parent() -> None:
    # Threads other tests left (a lease watcher, a sampler) may end meanwhile: compare sets.
    before = set(threading.enumerate())

    def reader(lo: int) -> chute.IterDataset[int]:
        return chute.experimental.ThreadPrefetchIterDataset(
            chute.MapDataset.range(lo, lo + 50).to_iter_dataset(chute.ReadOptions(num_threads=0)),
            prefetch_buffer_size=4,
        )

    for combine in (
        lambda ps: chute.experimental.ZipIterDataset(ps),
        lambda ps: chute.IterDataset.mix(ps),
    ):
        it = iter(combine([reader(0), reader(100)]))
        it.start_prefetch()
        assert len(set(threading.enumerate()) - before) >= 2  # one producer per parent
        next(it)
        it.close()
        assert set(threading.enumerate()) - before == set()


def test_zip_keeps_its_state_shape() -> None:
    a = chute.MapDataset.range(5).to_iter_dataset()
    ds = chute.experimental.ZipIterDataset([a, a.map(_double)])
    it = iter(ds)
    next(it)
    state = it.get_state()
    assert state["stage"] == "zip" and [s["stage"] for s in state["parents"]] == [
        "to_iter_dataset",
        "map",
    ]
    assert_equal_output_after_checkpoint(ds)
    with pytest.raises(chute.CheckpointError, match=r"state\['parents'\] is not a list of 2"):
        iter(ds).set_state({"stage": "zip", "parents": [state["parents"][0]]})


def _records(it: Any) -> dict[str, tuple[str, bool, bool]]:
    """Each stage's (role, pass-through, internal) as the debug records hold them."""
    return {r.name: (r.role, r.pass_through, r.internal) for r, _ in it.top.records()}


def test_debug_records_carry_roles_pass_through_and_internal_stages(
    debug_mode: None, capsys: pytest.CaptureFixture[str]
) -> None:
    src = chute.MapDataset.range(40).seed(1).map(_double)
    ds = src.to_iter_dataset().map(_double).batch(4)
    it = iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=0)))
    list(it)
    records = _records(it)
    # The user's stages that do no work of their own: shown, never the bottleneck.
    assert records["MultiprocessPrefetchIterDataset(num_workers=0)"] == (
        "pass_through",
        True,
        False,
    )
    assert records["SeedMapDataset(seed=1)"] == ("pass_through", True, False)
    assert records["BatchIterDataset(batch_size=4, drop_remainder=False)"] == (
        "order_dependent",
        False,
        False,
    )
    it = iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))
    list(it)
    it.close()
    records = _records(it)
    assert records["MultiprocessPrefetchIterDataset(num_workers=2)"] == ("prefetch", False, False)
    # The engine's stand-in for the map moved into the workers: hidden from the summary.
    assert records["map (done in the workers)"] == ("pass_through", True, True)
    capsys.readouterr()
