"""`DatasetOptions` attached with `WithOptionsIterDataset` set the filters' thresholds
below them, as in Grain: over `filter_raise_threshold_ratio` raises ValueError, over
`filter_warn_threshold_ratio` logs a warning (the "chute" logger); options nearer the
consumer win."""

import logging

import pytest

import chute
from chute.experimental import DatasetOptions, WithOptionsIterDataset


def _drop_all() -> chute.IterDataset[int]:
    return chute.MapDataset.range(1000).to_iter_dataset().filter(lambda x: False)


def _drop_two_thirds(workers: int = 0) -> chute.IterDataset[int]:
    ds = chute.MapDataset.source([1, 2, 3]).repeat(1000).filter(lambda x: x > 2)
    it = ds.to_iter_dataset()
    if workers:
        it = it.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
    return it


def test_raise_threshold_on_a_stream_filter() -> None:
    ds = WithOptionsIterDataset(_drop_all(), DatasetOptions(filter_raise_threshold_ratio=0.999))
    with pytest.raises(ValueError, match=r"skipped 100.00 % of the last seen 1000 elements"):
        list(ds)


@pytest.mark.parametrize("workers", [0, 2])
def test_raise_threshold_on_a_map_dataset_filter(
    workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    ds = _drop_two_thirds(workers)
    with pytest.raises(ValueError, match=r"filter_raise_threshold_ratio=0\.1"):
        list(WithOptionsIterDataset(ds, DatasetOptions(filter_raise_threshold_ratio=0.1)))
    # Without the options: a third kept, no error (and no warning under 90 %).
    caplog.clear()
    assert len(list(ds)) == 1000
    assert not _filter_warnings(caplog)


def _filter_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "chute" and r.levelno == logging.WARNING and "skipped" in r.getMessage()
    ]


def test_warn_threshold_and_precedence(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="chute")
    ds = WithOptionsIterDataset(_drop_two_thirds(), DatasetOptions(filter_warn_threshold_ratio=0.5))
    list(ds)
    assert any("skipped 66." in m for m in _filter_warnings(caplog))
    # The outer options (nearer the consumer) win over the inner ones.
    inner = WithOptionsIterDataset(_drop_all(), DatasetOptions(filter_raise_threshold_ratio=0.5))
    outer = WithOptionsIterDataset(inner, DatasetOptions(filter_raise_threshold_ratio=None))
    caplog.clear()
    assert list(outer) == []
    assert any("skipped 100.00 %" in m for m in _filter_warnings(caplog))
    with pytest.raises(ValueError):
        list(inner)
    # Outside WithOptionsIterDataset the defaults hold again.
    caplog.clear()
    assert list(_drop_all()) == []
    assert any("skipped 100.00 %" in m for m in _filter_warnings(caplog))


@pytest.mark.parametrize("workers", [0, 1])
def test_options_below_the_filter_apply_too(workers: int) -> None:
    """As in Grain, options set anywhere in the pipeline apply to all of it: here to a
    filter above the stage that sets them (and above the workers)."""
    ds = chute.MapDataset.source([1, 2, 3]).repeat(1000).to_iter_dataset()
    ds = WithOptionsIterDataset(ds, DatasetOptions(filter_raise_threshold_ratio=0.1))
    if workers:
        ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
    with pytest.raises(ValueError, match="filter_raise_threshold_ratio"):
        list(ds.filter(lambda x: x > 2))
