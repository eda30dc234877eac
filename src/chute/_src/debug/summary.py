"""The text the debug layer prints: the execution summary's table, and the pipeline graph.

`summary_text(stats)` is `PipelineStats.summary()`: per stage its share of the consumer's
waiting, time per element, elements, rate, CPU share and buffer, in at most `WIDTH`
columns, the advice beneath, then what AUTOTUNE chose. `graph_text(stats)` is the text
graph `py_dataset_visualization_output_dir` writes: each stage, then the spec of what it
produces. The figures come from `stats.py`; this module only lays them out.
"""

from __future__ import annotations

import re
import textwrap
from typing import TYPE_CHECKING

from chute._src.debug import diagnosis

if TYPE_CHECKING:
    from chute._src.debug.stats import PipelineStats, StageStats, TunedStage

__all__ = ["WIDTH", "graph_text", "summary_text"]

WIDTH = 100  # the summary's lines are at most this wide

_NOTE = (
    "% wait: share of the consumer's waiting for data attributed to the stage (* the "
    "bottleneck). % CPU: time on a CPU over the stage's own time, less time queued for one. "
    "Map stages are timed per element over blocks; chute.stats(it) has min/max/total too."
)


_label = diagnosis.label


def _wrap(text: str, width: int, max_lines: int = 3) -> list[str]:
    """`text` in lines of at most `width`, broken after ", ", a space, "(" or "="; a word
    longer than a line keeps its head and tail around "…", and the last line ends with
    "…" when more lines would be needed."""
    pieces = [p for p in re.findall(r"[^ ,(=]*(?:, |,| |\(|=|$)", text) if p]
    lines: list[str] = [""]
    for piece in pieces:
        if len(piece) > width:
            half = (width - 1) // 2
            piece = piece[:half] + "…" + piece[len(piece) - (width - 1 - half) :]
        if lines[-1] and len(lines[-1]) + len(piece.rstrip()) > width:
            lines.append("")
        lines[-1] += piece
    lines = [line.rstrip() for line in lines]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: width - 1] + "…"
    return lines


def summary_text(stats: PipelineStats) -> str:
    """The execution summary: a table at most `WIDTH` columns wide, the advice beneath,
    then what AUTOTUNE chose."""
    b = stats.bottleneck
    show_buffered = any(s.buffered_elements is not None for s in stats.stages)
    headers = ["id", "stage", "in", "% wait", "avg/elem", "elements", "elems/s", "% CPU"]
    headers += ["buffered"] if show_buffered else []
    rows = []
    for s in stats.stages:
        row = [
            f"{s.id}{'*' if b is not None and s.id == b.id else ''}",
            _label(s.name),
            ",".join(map(str, s.inputs)) or "-",
            f"{s.wait_percent:.1f}%",
            _dur(s.mean_s),
            f"{s.elements:,}",
            f"{s.elements_per_s:,.0f}" if s.elements_per_s else "-",
            f"{s.cpu_percent:.0f}%" if s.cpu_percent is not None else "-",
        ]
        if show_buffered:
            row.append(
                f"{s.buffered_elements} ({_bytes(s.buffered_bytes or 0)})"
                if s.buffered_elements is not None
                else ""
            )
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    sep = "  "
    others = sum(w for i, w in enumerate(widths) if i != 1) + len(sep) * (len(widths) - 1)
    widths[1] = max(16, min(widths[1], WIDTH - others))
    right = {0, 3, 4, 5, 6, 7, 8}  # figures are right-aligned

    def line(cells: list[str]) -> str:
        out = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ]
        return sep.join(out).rstrip()

    body = [line(headers), line(["-" * w for w in widths])]
    for row in rows:
        name = _wrap(row[1], widths[1])
        body.append(line([*row[:1], name[0], *row[2:]]))
        body.extend(line(["", more] + [""] * (len(row) - 2)) for more in name[1:])
    return "\n".join(
        [
            "chute execution summary:",
            *textwrap.wrap(_NOTE, WIDTH),
            "",
            *body,
            "",
            *textwrap.wrap(stats.advice(), WIDTH),
            *_render_tuned(stats.tuned),
        ]
    )


_SHOWN_DECISIONS = 3  # per setting, the latest


def _render_tuned(tuned: tuple[TunedStage, ...]) -> list[str]:
    """What AUTOTUNE chose, stage by stage, with each setting's latest decisions and their
    reasons."""
    if not tuned:
        return []
    lines = ["", "chute.AUTOTUNE chose (each setting's latest decisions):"]
    for t in tuned:
        now = ", ".join(f"{k} = {v}" for k, v in t.current.items())
        lines.extend(
            textwrap.wrap(f"{t.id} {_label(t.name)}: {now}", WIDTH, subsequent_indent="    ")
        )
        for setting in t.current:
            mine = [d for d in t.decisions if d.setting == setting]
            if len(mine) > _SHOWN_DECISIONS:
                lines.append(f"    ({len(mine) - _SHOWN_DECISIONS} earlier for {setting})")
            for d in mine[-_SHOWN_DECISIONS:]:
                lines.extend(
                    textwrap.wrap(
                        str(d).strip(), WIDTH, initial_indent="    ", subsequent_indent="      "
                    )
                )
    return lines


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.2f} {unit}"
    return f"{s * 1e9:.0f} ns"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def graph_text(stats: PipelineStats) -> str:
    """The text graph: each stage, then the spec of what it produces."""
    by_id = {s.id: s for s in stats.stages}
    lines = ["chute pipeline graph:", ""]
    done: set[int] = set()

    def emit(s: StageStats) -> None:
        if s.id in done:
            return
        done.add(s.id)
        for i in s.inputs:
            if i in by_id:
                emit(by_id[i])
        if not s.inputs:
            lines.append(f"[{s.id}] {s.name}")
        else:
            src = "" if len(s.inputs) == 1 else f"  (inputs {', '.join(map(str, s.inputs))})"
            lines.extend(["  ││", f"  ││  [{s.id}] {s.name}{src}", "  ││", "  ╲╱"])  # noqa: RUF001
        lines.append(repr(s.spec))
        lines.append("")

    for s in stats.stages:
        if not any(s.id in t.inputs for t in stats.stages):
            emit(s)
    return "\n".join(lines).rstrip()
