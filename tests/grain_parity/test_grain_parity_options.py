"""ReadOptions checks its values in Grain's words, and logs Grain's warning when the
buffer is smaller than the thread count."""

import logging

import pytest

import chute


@pytest.mark.parametrize("name", ["num_threads", "prefetch_buffer_size"])
def test_negative_raises(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be non-negative"):
        chute.ReadOptions(**{name: -1})


def test_small_buffer_logs_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        chute.ReadOptions(num_threads=10, prefetch_buffer_size=5)
    assert "prefetch_buffer_size=5 is smaller than num_threads=10" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        chute.ReadOptions(num_threads=10, prefetch_buffer_size=0)
        chute.ReadOptions(num_threads=4, prefetch_buffer_size=4)
        chute.ReadOptions(num_threads=10)
    assert caplog.text == ""
