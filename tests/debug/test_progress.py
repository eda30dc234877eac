"""chute.progress: draws in a terminal and in a notebook, stays silent in logs."""

from __future__ import annotations

import io
import os
import pty
import sys
import types

import pytest

import chute


def read_all(fd: int) -> str:
    chunks = []
    os.set_blocking(fd, False)
    while True:
        try:
            data = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode()


def test_draws_counts_and_rate_on_a_terminal() -> None:
    master, slave = pty.openpty()
    with os.fdopen(slave, "w", encoding="utf-8") as term:
        # few items: nobody reads the terminal until the end, and its buffer is small
        items = list(chute.progress(range(20), desc="load", file=term, interval=0))
        term.flush()
        out = read_all(master)
    os.close(master)
    assert items == list(range(20))
    assert "load:" in out and "20/20 elements" in out and "100%" in out
    assert "elements/s" in out
    # each redraw starts with "\r" and is padded with spaces over a longer earlier line
    last = out.rstrip("\r\n").split("\r")[-1]
    assert last.startswith("load: 20/20 elements") and last.rstrip(" ").endswith("]")


def test_unknown_total_shows_count_rate_and_elapsed() -> None:
    out = io.StringIO()
    result = sum(chute.progress(iter(range(7)), desc="stream", file=out, force=True))
    assert result == 21
    last = out.getvalue().splitlines()[-1].split("\r")[-1]
    assert last.startswith("stream: 7 elements [0:0")
    assert "elements/s]" in last


def test_a_dataset_gives_its_length_as_the_total() -> None:
    out = io.StringIO()
    ds = chute.MapDataset.range(12).batch(4)
    batches = list(chute.progress(ds, unit="batches", file=out, force=True))
    assert len(batches) == 3
    assert "3/3 batches" in out.getvalue()


def test_nothing_is_written_when_output_is_not_a_terminal() -> None:
    out = io.StringIO()
    assert list(chute.progress(range(100), file=out, interval=0)) == list(range(100))
    assert out.getvalue() == ""


def test_force_false_turns_it_off_even_on_a_terminal() -> None:
    master, slave = pty.openpty()
    with os.fdopen(slave, "w", encoding="utf-8") as term:
        list(chute.progress(range(5), file=term, force=False, interval=0))
        term.flush()
        out = read_all(master)
    os.close(master)
    assert out == ""


def test_bytes_give_a_transfer_rate() -> None:
    out = io.StringIO()
    blobs = [b"x" * 1000] * 10
    list(chute.progress(blobs, nbytes=len, file=out, force=True))
    assert "MB/s" in out.getvalue()


def test_a_notebook_kernel_draws_on_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class ZMQInteractiveShell:
        kernel = object()

    fake_ipython = types.ModuleType("IPython")
    fake_ipython.get_ipython = ZMQInteractiveShell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    list(chute.progress(range(4), desc="nb"))
    captured = capsys.readouterr()
    assert "\rnb: 4/4 elements 100%|" in captured.out
    assert captured.err == ""


def test_a_terminal_ipython_is_not_a_notebook(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_ipython = types.ModuleType("IPython")
    fake_ipython.get_ipython = lambda: object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython)
    list(chute.progress(range(4), desc="term"))
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_errors_name_the_value_and_the_fix() -> None:
    with pytest.raises(TypeError, match=r"42 is not iterable; wrap a dataset"):
        chute.progress(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"total=-1 is negative"):
        chute.progress(range(3), total=-1)


def test_update_without_an_iterable() -> None:
    out = io.StringIO()
    with chute.Progress[int](total=10, desc="manual", unit="files", file=out, force=True) as bar:
        for _ in range(10):
            bar.update(1)
    assert "10/10 files" in out.getvalue()
    with pytest.raises(TypeError, match=r"call update\(n\)"):
        iter(chute.Progress(total=3)).__next__()
