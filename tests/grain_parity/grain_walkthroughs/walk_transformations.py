"""Transformations, as in Grain's transformations guide: the transform classes (map, random
map, filter, batch, map with index, flat map) used in a Dataset pipeline and in a
DataLoader's operations.
"""

import numpy as np

import chute as grain


class Tokenize(grain.transforms.Map):
    def map(self, element: str) -> list[str]:
        return element.split()


class Dropout(grain.transforms.RandomMap):
    def random_map(self, element: list[str], rng: np.random.Generator) -> list[str]:
        keep = rng.random(len(element)) < 0.5
        return [tok for tok, k in zip(element, keep) if k] or element[:1]


class Short(grain.transforms.Filter):
    def filter(self, element: list[str]) -> bool:
        return len(element) <= 3


class Numbered(grain.transforms.MapWithIndex):
    def map_with_index(self, index: int, element: str) -> str:
        return f"{index}:{element}"


class Words(grain.experimental.FlatMapTransform):
    max_fan_out = 4

    def flat_map(self, element: str) -> list[str]:
        # Grain 0.2.18 takes a sized sequence here (a generator fails there).
        return element.split()


SENTENCES = ["a b", "c d e", "f g h i", "j", "k l", "m n o p"]


def main() -> None:
    base = grain.MapDataset.source(SENTENCES)

    # map with a transform object, then filter: the long sentences become None.
    tokens = base.map(Tokenize())
    assert tokens[1] == ["c", "d", "e"]
    short = tokens.filter(Short())
    assert [x for x in short if x is not None] == [["a", "b"], ["c", "d", "e"], ["j"], ["k", "l"]]

    # random_map: seeded, so the same seed gives the same result; every output is a
    # non-empty subsequence of its input.
    dropped = tokens.random_map(Dropout(), seed=9)
    again = tokens.random_map(Dropout(), seed=9)
    assert list(dropped) == list(again)
    for full, part in zip(tokens, dropped):
        assert part and all(tok in full for tok in part)
    # The seed can also come from the pipeline.
    seeded = base.seed(4).map(Tokenize()).random_map(Dropout())
    assert len(list(seeded)) == len(SENTENCES)

    # map_with_index sees the element's position.
    assert list(base.map_with_index(Numbered()))[:2] == ["0:a b", "1:c d e"]

    # Batch as a transform object.
    ids = grain.MapDataset.range(7).batch(batch_size=3)
    assert [b.tolist() for b in ids] == [[0, 1, 2], [3, 4, 5], [6]]

    # Flat map: one element becomes several (at most max_fan_out).
    words = grain.experimental.FlatMapIterDataset(base.to_iter_dataset(), Words())
    assert list(words) == " ".join(SENTENCES).split()
    fixed = grain.experimental.FlatMapMapDataset(base, Words())
    assert len(fixed) == len(SENTENCES) * Words.max_fan_out
    assert [w for w in fixed if w is not None] == " ".join(SENTENCES).split()

    # The same transforms as DataLoader operations.
    loader = grain.DataLoader(
        data_source=SENTENCES,
        sampler=grain.samplers.IndexSampler(
            num_records=len(SENTENCES),
            shard_options=grain.sharding.NoSharding(),
            shuffle=True,
            num_epochs=1,
            seed=2,
        ),
        operations=[Tokenize(), Short(), Dropout()],
        worker_count=0,
    )
    out = list(loader)
    assert len(out) == 4
    allowed = [["a", "b"], ["c", "d", "e"], ["j"], ["k", "l"]]
    for part in out:
        assert any(part and all(tok in full for tok in part) for full in allowed)
    # Each short sentence appears once: its tokens never mix with another's.
    firsts = {"a": 0, "b": 0, "c": 1, "d": 1, "e": 1, "j": 2, "k": 3, "l": 3}
    assert sorted(firsts[part[0]] for part in out) == [0, 1, 2, 3]

    print("ok")


if __name__ == "__main__":
    main()
