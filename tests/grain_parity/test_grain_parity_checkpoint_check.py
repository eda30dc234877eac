"""`chute.testing.assert_equal_output_after_checkpoint` takes an iterator as well as a
dataset (`iter` gives it back as it is), as Grain's checker does: Grain's tests give it an
ElasticIterator."""

import chute


def test_checkpoint_checker_takes_an_iterator() -> None:
    ds = chute.MapDataset.range(30).map(lambda x: x * 2).shuffle(42)
    it = chute.experimental.ElasticIterator(ds, 5, chute.sharding.NoSharding())
    chute.testing.assert_equal_output_after_checkpoint(it)
    chute.testing.assert_equal_output_after_checkpoint(iter(ds.to_iter_dataset()))
