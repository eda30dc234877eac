"""The coverage table of the conformance suite: operations x modes x events.

    CHUTE_CONFORMANCE_LOG=/tmp/cf.jsonl pytest -m "slow or not slow" tests/conformance
    PYTHONPATH=src:tests python -m conformance.coverage /tmp/cf.jsonl

reads the log the tests write (one line per case that ran: its operations, the ways it
ran, its events and the invariants checked) and prints, for each operation, how many
cases ran it in each mode and with each event, then the invariants' counts. Without a log,
it draws 300 cases from the suite's strategies (nothing runs) and prints what the grammar
reaches.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from typing import Any

MODES = ["in process", "threads", "1 workers", "2 workers", "ray", "DataLoader",
         "DataLoader 1 workers", "DataLoader 2 workers"]  # fmt: skip
EVENTS = ["restore", "restore into other workers", "weights changed"]


def table(records: list[dict[str, Any]]) -> str:
    cells: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        for op in set(r["ops"]):
            for m in r["modes"]:
                cells[op][m] += 1
            for e in r["events"]:
                cells[op][e] += 1
            cells[op]["cases"] += 1
    cols = ["cases", *MODES, *EVENTS]
    head = ["operation", *cols]
    rows = [[op, *(str(cells[op][c]) for c in cols)] for op in sorted(cells)]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        lines.append("| " + " | ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)) + " |")
    inv = Counter(i for r in records for i in r["checked"])
    lines.append("")
    lines.append(f"{len(records)} cases; invariants checked: " + ", ".join(
        f"{k} {v}" for k, v in sorted(inv.items())))  # fmt: skip
    return "\n".join(lines)


def drawn(n: int = 300) -> list[dict[str, Any]]:
    """`n` cases drawn from the strategies (not run), described as the tests log them."""
    from hypothesis import given, settings

    from conformance import strategies as cst
    from conformance.test_conformance import describe

    out: list[dict[str, Any]] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None)
    @given(case=cst.cases(workers=[0, 1, 2]))
    def collect(case: Any) -> None:
        out.append(describe(case, ["resume"]))

    collect()
    return out


def main(argv: list[str]) -> None:
    if argv:
        with open(argv[0]) as f:
            records = [json.loads(line) for line in f if line.strip()]
    else:
        records = drawn()
    print(table(records))


if __name__ == "__main__":
    main(sys.argv[1:])
