"""A transform's `sys.exit()` under workers is a RuntimeError with Grain's words ("Worker
process was terminated unexpectedly with exit code N"), also for the first element, which
chute computes in this process while the workers start."""

import sys

import pytest

import chute


class ExitAlways(chute.transforms.Map):
    def map(self, element: int) -> int:
        sys.exit(123)


def test_first_element_exit_is_a_worker_error() -> None:
    loader = chute.DataLoader(
        data_source=chute.sources.RangeDataSource(0, 8, 1),
        sampler=chute.SequentialSampler(8, chute.sharding.NoSharding()),
        operations=[ExitAlways()],
        worker_count=2,
    )
    with pytest.raises(RuntimeError, match="was terminated unexpectedly with exit code 123") as e:
        list(loader)
    assert "element at index 0" in str(e.value)


def test_stream_under_mp_prefetch() -> None:
    ds = chute.MapDataset.range(4).to_iter_dataset().map(ExitAlways())
    ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=1))
    with pytest.raises(RuntimeError, match="Worker process was terminated unexpectedly"):
        list(ds)
