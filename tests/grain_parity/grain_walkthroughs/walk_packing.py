"""Packing variable-length sequences into fixed-length rows, as in Grain's packing
walkthrough: `grain.experimental.FirstFitPackIterDataset` with a `length_struct`, and the
segment ids and positions it adds.
"""

import numpy as np

import chute as grain

LENGTHS = [3, 5, 2, 6, 1, 4, 7, 2]
ROW = 8


def examples() -> list[dict[str, np.ndarray]]:
    out = []
    for i, n in enumerate(LENGTHS):
        tokens = np.full(n, i + 1, dtype=np.int32)  # every token names its example
        out.append({"inputs": tokens, "targets": tokens * 10})
    return out


def main() -> None:
    ds = grain.MapDataset.source(examples()).to_iter_dataset()
    packed = grain.experimental.FirstFitPackIterDataset(
        ds,
        length_struct={"inputs": ROW, "targets": ROW},
        num_packing_bins=3,
        shuffle_bins=False,
    )
    rows = list(packed)
    assert rows
    seen: dict[int, int] = {}
    for row in rows:
        assert set(row) >= {"inputs", "targets", "inputs_segment_ids", "inputs_positions"}
        inputs = row["inputs"]
        assert inputs.shape == (ROW,)
        assert (row["targets"] == inputs * 10).all()
        seg = row["inputs_segment_ids"]
        pos = row["inputs_positions"]
        # Padding is zero, with segment id 0.
        assert ((seg == 0) == (inputs == 0)).all()
        # Segments are numbered 1, 2, ... in the row; positions restart at 0 in each.
        segments = sorted(set(seg[seg > 0].tolist()))
        assert segments == list(range(1, len(segments) + 1))
        for s in segments:
            where = seg == s
            example = set(inputs[where].tolist())
            assert len(example) == 1
            assert pos[where].tolist() == list(range(int(where.sum())))
            seen[example.pop()] = int(where.sum())
    # Every example is packed whole, exactly once.
    assert seen == {i + 1: n for i, n in enumerate(LENGTHS)}
    assert sum(int((r["inputs_segment_ids"] > 0).sum()) for r in rows) == sum(LENGTHS)

    # The packed iterator checkpoints like any other.
    it = iter(packed)
    next(it)
    state = it.get_state()
    rest = [r["inputs"].tolist() for r in it]
    again = iter(packed)
    again.set_state(state)
    assert [r["inputs"].tolist() for r in again] == rest

    print("ok")


if __name__ == "__main__":
    main()
