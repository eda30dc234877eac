"""Advanced Dataset use, as in Grain's advanced Dataset tutorial: mixing sources by weight,
interleaving iterable datasets, saving and restoring the iterator with Orbax, and running
the pipeline in worker processes with multiprocess prefetch.
"""

import tempfile

import orbax.checkpoint as ocp

import chute as grain


def scale(x: int) -> int:
    return x * 10


def mixing() -> None:
    apples = grain.MapDataset.source([f"apple{i}" for i in range(6)])
    pears = grain.MapDataset.source([f"pear{i}" for i in range(6)])
    # Equal weights: the mixture alternates until the shorter source runs out.
    both = grain.MapDataset.mix([apples, pears], weights=[0.5, 0.5])
    first = [both[i] for i in range(12)]
    assert sorted(first) == sorted([f"apple{i}" for i in range(6)] + [f"pear{i}" for i in range(6)])
    # Weight 3:1 draws three apples for each pear.
    tilted = grain.MapDataset.mix([apples.repeat(), pears.repeat()], weights=[3, 1])
    head = [tilted[i] for i in range(40)]
    assert sum(w.startswith("apple") for w in head) == 30

    # IterDataset.mix works on iterable pipelines, e.g. ones with a filter.
    numbers = grain.MapDataset.range(20).to_iter_dataset()
    odd = numbers.filter(lambda x: x % 2 == 1)
    even = numbers.filter(lambda x: x % 2 == 0)
    merged = list(grain.IterDataset.mix([odd, even], weights=[1, 1]))
    # It stops once one side is exhausted; no element repeats and each side keeps its order.
    assert len(merged) >= 19 and len(set(merged)) == len(merged)
    odds = [x for x in merged if x % 2 == 1]
    evens = [x for x in merged if x % 2 == 0]
    assert odds == list(range(1, 20, 2))[: len(odds)]
    assert evens == list(range(0, 20, 2))[: len(evens)]


def interleaving() -> None:
    # Each "file" yields its own lines; interleave reads cycle_length of them at a time.
    files = [
        grain.MapDataset.source([f"f{f}-line{j}" for j in range(3)]).to_iter_dataset()
        for f in range(4)
    ]
    lines = list(grain.experimental.InterleaveIterDataset(files, cycle_length=2))
    assert sorted(lines) == sorted(f"f{f}-line{j}" for f in range(4) for j in range(3))
    # Within one file the lines keep their order.
    for f in range(4):
        own = [x for x in lines if x.startswith(f"f{f}-")]
        assert own == [f"f{f}-line{j}" for j in range(3)]


def orbax_checkpointing() -> None:
    pipeline = grain.MapDataset.range(50).shuffle(seed=11).map(scale).to_iter_dataset().batch(5)
    expected = [b.tolist() for b in pipeline]
    it = iter(pipeline)
    for _ in range(3):
        next(it)
    with tempfile.TemporaryDirectory() as workdir:
        manager = ocp.CheckpointManager(workdir)
        manager.save(step=3, args=ocp.args.Composite(loader=grain.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
        assert manager.latest_step() == 3
        next(it)  # move on, so the restore has something to undo

        resumed = iter(pipeline)
        manager.restore(
            3, args=ocp.args.Composite(loader=grain.checkpoint.CheckpointRestore(resumed))
        )
        assert [b.tolist() for b in resumed] == expected[3:]
        manager.close()


def multiprocess_prefetch() -> None:
    pipeline = grain.MapDataset.range(40).shuffle(seed=5).map(scale).to_iter_dataset()
    single = list(pipeline)
    parallel = pipeline.mp_prefetch(grain.multiprocessing.MultiprocessingOptions(num_workers=2))
    it = iter(parallel)
    head = [next(it) for _ in range(7)]
    saved = it.get_state()
    rest = list(it)
    assert sorted(head + rest) == [x * 10 for x in range(40)]
    assert sorted(head + rest) == sorted(single)
    # The iterator state resumes the parallel run.
    again = iter(parallel)
    again.set_state(saved)
    assert list(again) == rest


def main() -> None:
    mixing()
    interleaving()
    orbax_checkpointing()
    multiprocess_prefetch()
    print("ok")


if __name__ == "__main__":
    main()
