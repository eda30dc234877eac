"""The pipeline graph as a picture: hand-written SVG, annotated with each stage's figures.

`PipelineStats.to_svg()` draws one box per stage, sources at the top and the consumer at
the bottom, in layers (a stage sits one layer below its deepest input), with an arrow
from each input (a mix or zip has several). Each box shows the stage's name, the spec of
what it produces, elements, elements/s, CPU, and its share of the consumer's waiting as
text and as a bar; the bottleneck is drawn in red. Stages behind a prefetch boundary
(threads, worker processes) have a dashed outline. The advice is written beneath.

No dependency: the text is XML-escaped, sizes are estimated for a monospace font.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from xml.sax.saxutils import escape

if TYPE_CHECKING:
    from chute._src.debug.stats import PipelineStats, StageStats

__all__ = ["to_svg"]

BOX_W = 380
BOX_H = 121
GAP_X = 40
GAP_Y = 56
MARGIN = 24
FONT = 12
CHAR_W = 7.3  # width of one character of a 12 px monospace font
HEADER_H = 52
LINE_H = 17

_STYLE = """
text { font-family: 'DejaVu Sans Mono', Menlo, Consolas, monospace; font-size: 12px;
       fill: #1f2328; }
.title { font-size: 16px; font-weight: bold; }
.name { font-weight: bold; }
.dim { fill: #57606a; }
.box { fill: #f6f8fa; stroke: #57606a; stroke-width: 1.2; }
.box.boundary { stroke-dasharray: 6 4; fill: #eef6ff; }
.box.bottleneck { fill: #fff0ee; stroke: #cf222e; stroke-width: 3; }
.waitbg { fill: #e6e8eb; }
.wait { fill: #0969da; }
.wait.bottleneck { fill: #cf222e; }
.tag { fill: #cf222e; font-weight: bold; }
.edge { fill: none; stroke: #57606a; stroke-width: 1.5; }
"""


def _cut(text: str, width_px: float) -> str:
    n = int(width_px / CHAR_W)
    return text if len(text) <= n else text[: max(1, n - 1)] + "…"


def _rate(x: float | None) -> str:
    if not x:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _two_lines(text: str, width_px: float) -> list[str]:
    """`text` in at most two lines, broken after a comma or a parenthesis if one is near.

    >>> _two_lines("Prefetch(read_options=ReadOptions(num_threads=0, size=500))", 260)
    ['Prefetch(read_options=ReadOptions(', 'num_threads=0, size=500))']
    """
    n = int(width_px / CHAR_W)
    if len(text) <= n:
        return [text]
    cut = max(text.rfind(", ", 0, n) + 2, text.rfind("(", 0, n) + 1, text.rfind("=", 0, n) + 1)
    if cut < n // 2:
        cut = n
    return [text[:cut].rstrip(), _cut(text[cut:].lstrip(), width_px)]


def _wrap(text: str, width_px: float) -> list[str]:
    n = max(20, int(width_px / CHAR_W))
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > n:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def layers(stats: PipelineStats) -> list[list[StageStats]]:
    """Stages in layers: sources first, each stage one layer below its deepest input."""
    by_id = {s.id: s for s in stats.stages}
    depth: dict[int, int] = {}

    def level(s: StageStats, path: frozenset[int]) -> int:
        if s.id not in depth:
            parents = [by_id[i] for i in s.inputs if i in by_id and i not in path]
            depth[s.id] = 1 + max((level(p, path | {s.id}) for p in parents), default=-1)
        return depth[s.id]

    for s in stats.stages:
        level(s, frozenset())
    # Then each stage moves down to just above its nearest consumer, so a short branch
    # of a mix sits beside the long one and its arrow does not cross another layer.
    consumers: dict[int, list[int]] = {s.id: [] for s in stats.stages}
    for s in stats.stages:
        for i in s.inputs:
            if i in consumers:
                consumers[i].append(s.id)
    for s in sorted(stats.stages, key=lambda s: -depth[s.id]):
        below = [depth[c] for c in consumers[s.id] if depth[c] > depth[s.id]]
        if below:
            depth[s.id] = min(below) - 1
    out: list[list[StageStats]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for s in stats.stages:
        out[depth[s.id]].append(s)
    return out


def to_svg(stats: PipelineStats) -> str:
    """An SVG document of the pipeline graph with each stage's figures.

    >>> import chute, xml.etree.ElementTree as ET
    >>> chute.config.update("py_debug_mode", True)
    >>> it = iter(chute.MapDataset.range(100).map(abs).to_iter_dataset().batch(10))
    >>> _ = list(it)
    >>> svg = chute.stats(it).to_svg()
    >>> ET.fromstring(svg).tag
    '{http://www.w3.org/2000/svg}svg'
    >>> chute.config.update("py_debug_mode", False)
    """
    rows = layers(stats)
    bottleneck = stats.bottleneck
    pos = _place(rows, stats)
    width = max(max((x for x, _ in pos.values()), default=0) + BOX_W + MARGIN, 560)
    advice = _wrap(stats.advice(), width - 2 * MARGIN)
    subtitle = _wrap(
        f"consumer waited {stats.consumer_wait_s:.3f} s for data; % wait: its share spent "
        "in each stage; dashed: runs on other threads or processes",
        width - 2 * MARGIN,
    )
    extra = LINE_H * (len(subtitle) - 1)  # the boxes move down under a longer header
    pos = {i: (x, y + extra) for i, (x, y) in pos.items()}
    graph_h = len(rows) * BOX_H + max(0, len(rows) - 1) * GAP_Y + extra
    height = MARGIN + HEADER_H + graph_h + 24 + LINE_H * len(advice) + MARGIN

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}">',
        f"<style>{_STYLE}</style>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        'fill="#57606a"/></marker></defs>',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
        f'<text class="title" x="{MARGIN}" y="{MARGIN + 14}">chute pipeline graph</text>',
    ]
    out += [
        f'<text class="dim" x="{MARGIN}" y="{MARGIN + 34 + k * LINE_H}">{escape(line)}</text>'
        for k, line in enumerate(subtitle)
    ]
    for s in stats.stages:  # edges first, so boxes cover their ends
        if s.id not in pos:
            continue
        cx, cy = pos[s.id]
        parents = [i for i in s.inputs if i in pos]
        for j, i in enumerate(parents):
            px, py = pos[i]
            x1, y1 = px + BOX_W / 2, py + BOX_H
            x2 = cx + BOX_W * (j + 1) / (len(parents) + 1)
            y2 = cy - 2
            mid = (y1 + y2) / 2
            out.append(
                f'<path class="edge" d="M {x1:.1f} {y1:.1f} C {x1:.1f} {mid:.1f} {x2:.1f} '
                f'{mid:.1f} {x2:.1f} {y2:.1f}" marker-end="url(#arrow)"/>'
            )
    for s in stats.stages:
        if s.id in pos:
            out.extend(_box(s, *pos[s.id], bottleneck is not None and s.id == bottleneck.id))
    y = MARGIN + HEADER_H + graph_h + 24
    for k, line in enumerate(advice):
        cls = "tag" if k == 0 and bottleneck is not None else "dim"
        out.append(f'<text class="{cls}" x="{MARGIN}" y="{y + k * LINE_H}">{escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _place(rows: list[list[StageStats]], stats: PipelineStats) -> dict[int, tuple[float, float]]:
    """Top-left corners of the boxes, placed from the consumer up: a stage goes above the
    stage it feeds, at its input's slot (inputs of a mix side by side, in order), and boxes
    of one layer are pushed apart where they would overlap."""
    step = BOX_W + GAP_X
    xs: dict[int, float] = {}
    for row in reversed(rows):
        wanted = {}
        for s in row:
            slots = [
                xs[c.id] + (c.inputs.index(s.id) - (len(c.inputs) - 1) / 2) * step
                for c in stats.stages
                if s.id in c.inputs and c.id in xs
            ]
            wanted[s.id] = sum(slots) / len(slots) if slots else s.id * step
        row.sort(key=lambda s: (wanted[s.id], s.id))
        for j, s in enumerate(row):
            x = wanted[s.id]
            xs[s.id] = max(x, xs[row[j - 1].id] + step) if j else x
    left = min(xs.values(), default=0.0)
    return {
        s.id: (xs[s.id] - left + MARGIN, MARGIN + HEADER_H + k * (BOX_H + GAP_Y))
        for k, row in enumerate(rows)
        for s in row
    }


def _box(s: StageStats, x: float, y: float, hot: bool) -> list[str]:
    cls = "box" + (" boundary" if s.boundary else "") + (" bottleneck" if hot else "")
    text_w = BOX_W - 20
    tx = x + 10
    spec = "" if s.spec is None else s.spec if isinstance(s.spec, str) else repr(s.spec)
    elements = f"{s.elements:,} elements, {_rate(s.elements_per_s)}/s"
    cpu = f"CPU {s.cpu_percent:.0f}%" if s.cpu_percent is not None else "CPU -"
    if s.buffered_elements is not None:
        cpu += f", {s.buffered_elements} buffered"
    bar_w = text_w - 10 * CHAR_W - 6
    fill = max(0.0, min(1.0, s.wait_percent / 100)) * bar_w
    name = _two_lines(f"[{s.id}] {s.name}", text_w)
    rows = [("name", line) for line in name] + [("", "")] * (2 - len(name))
    rows += [("dim", "-> " + spec), ("", f"{elements}, {cpu}")]
    lines = [
        f'<g id="stage-{s.id}"><title>{escape(f"[{s.id}] {s.name}")}</title>',
        f'<rect class="{cls}" x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="6"/>',
    ]
    for k, (kind, text) in enumerate(rows):
        if text:
            attr = f' class="{kind}"' if kind else ""
            lines.append(
                f'<text{attr} x="{tx:.1f}" y="{y + 20 + k * LINE_H:.1f}">'
                f"{escape(_cut(text, text_w))}</text>"
            )
    bar_y = y + 20 + len(rows) * LINE_H - 10
    lines += [
        f'<rect class="waitbg" x="{tx:.1f}" y="{bar_y:.1f}" width="{bar_w:.1f}" height="10" '
        'rx="2"/>',
        f'<rect class="wait{" bottleneck" if hot else ""}" x="{tx:.1f}" y="{bar_y:.1f}" '
        f'width="{fill:.1f}" height="10" rx="2"/>',
        f'<text x="{tx + bar_w + 6:.1f}" y="{bar_y + 10:.1f}">{s.wait_percent:.1f}% wait</text>',
    ]
    if hot:
        lines += [
            f'<rect x="{x + BOX_W - 104:.1f}" y="{y - 10:.1f}" width="94" height="20" rx="10" '
            'fill="#cf222e"/>',
            f'<text x="{x + BOX_W - 57:.1f}" y="{y + 4:.1f}" text-anchor="middle" '
            'fill="#ffffff" style="fill:#ffffff;font-weight:bold">BOTTLENECK</text>',
        ]
    lines.append("</g>")
    return lines
