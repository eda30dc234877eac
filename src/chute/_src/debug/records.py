"""`StageRecord`: the figures of one stage, accumulated where the stage runs.

Made in the main process with the instrumented pipeline (`instrument.py`); the records of
stages that run in worker processes travel there with the pipeline, and what they add is
sent back with each result (`take_delta`) and merged into the main process's copy by id
(`merge`). A stand-in for work done elsewhere lists the records that take its place
(`stands_for`), which `stats.py` shows where the stand-in is.
"""

from __future__ import annotations

import itertools
from typing import Any

from chute._src.core.contract import StageRole

_ids = itertools.count()


class StageRecord:
    """Figures of one stage, accumulated where it runs (picklable, merged from workers)."""

    __slots__ = (
        "blocks",
        "boundary",
        "calls",
        "cpu_ns",
        "cpu_wall_ns",
        "elements",
        "gil_busy",
        "id",
        "inputs",
        "internal",
        "kind",
        "max_ns",
        "min_ns",
        "name",
        "pass_through",
        "queued_ns",
        "role",
        "samples",
        "spec",
        "stage",
        "stands_for",
        "wall_ns",
    )

    def __init__(
        self,
        name: str,
        kind: str,
        inputs: list[int],
        boundary: bool = False,
        role: StageRole = StageRole.ORDER_DEPENDENT,
        internal: bool = False,
    ) -> None:
        self.id = next(_ids)
        self.name = name
        self.kind = kind  # "map" (MapDataset node, timed per block) or "iter"
        self.inputs = inputs
        self.boundary = boundary  # its inputs run on other threads or processes
        self.role = role.value  # what the stage is to the engine (`StageRole`)
        # A pass-through stage (a seed, mp_prefetch without workers) does no work of its
        # own: the summary never names it as the bottleneck. An internal one (the engine's
        # stand-in for a stage moved into workers) is not the user's: the summary hides it.
        self.pass_through = role is StageRole.PASS_THROUGH
        self.internal = internal
        self.stage = ""  # the stage's kind, as metrics label it (`stage_kind`)
        # Main process only, on the record of a stand-in (`_stands_for`): the records that
        # take its place, the one in its place first (see `stand_in_records`).
        self.stands_for: list[StageRecord] | None = None
        self.spec: Any = None
        self.calls = self.elements = self.wall_ns = self.cpu_ns = self.cpu_wall_ns = 0
        self.queued_ns = 0
        self.min_ns = 1 << 62
        self.max_ns = 0
        self.samples = self.gil_busy = 0
        # A stage under a reader: its elements of the blocks computed for the reader, not
        # yet handed out (`handout.py`), counted in `elements` as the reader hands them out.
        self.blocks: list[Any] = []

    def add(self, n: int, wall_ns: int, cpu: tuple[int, int] | None, counted: bool = True) -> None:
        """One call that produced `n` elements; `cpu` (on a CPU, queued for one) in ns, or
        None when it was not read. `counted=False`: the elements are counted later, as
        they are handed out (`blocks`)."""
        self.calls += 1
        if counted:
            self.elements += n
        self.wall_ns += wall_ns
        if cpu is not None:
            self.add_cpu(wall_ns, *cpu)
        if n:
            per = wall_ns // n
            self.min_ns = min(self.min_ns, per)
            self.max_ns = max(self.max_ns, per)

    def add_cpu(self, wall_ns: int, on_cpu_ns: int, queued_ns: int) -> None:
        """The CPU figures of one call. Linux can charge a thread woken while it runs (as
        GIL hand-overs do) with queue time it never spent, so the time queued is capped at
        the call's time off a CPU."""
        self.cpu_ns += on_cpu_ns
        self.queued_ns += max(0, min(queued_ns, wall_ns - on_cpu_ns))
        self.cpu_wall_ns += wall_ns

    def take_delta(self) -> tuple[Any, ...]:
        """The figures since the last call, and a reset (used in worker processes)."""
        delta = (
            self.id, self.calls, self.elements, self.wall_ns, self.cpu_ns, self.cpu_wall_ns,
            self.min_ns, self.max_ns, self.samples, self.gil_busy, self.spec, self.queued_ns,
            self.blocks,
        )  # fmt: skip
        self.blocks = []
        self.calls = self.elements = self.wall_ns = self.cpu_ns = self.cpu_wall_ns = 0
        self.queued_ns = 0
        self.samples = self.gil_busy = 0
        self.min_ns, self.max_ns = 1 << 62, 0
        return delta

    def cpu_estimate_ns(self) -> float:
        """CPU time over all calls, from the calls whose CPU time was read."""
        return self.cpu_ns / self.cpu_wall_ns * self.wall_ns if self.cpu_wall_ns else 0.0

    def queued_estimate_ns(self) -> float:
        """Time queued for a CPU over all calls, from the calls where it was read."""
        return self.queued_ns / self.cpu_wall_ns * self.wall_ns if self.cpu_wall_ns else 0.0

    def merge(self, delta: tuple[Any, ...]) -> None:
        _, calls, elements, wall, cpu, cpu_wall, lo, hi, samples, busy, spec, queued = delta[:12]
        self.blocks.extend(delta[12])
        self.calls += calls
        self.queued_ns += queued
        self.elements += elements
        self.wall_ns += wall
        self.cpu_ns += cpu
        self.cpu_wall_ns += cpu_wall
        self.min_ns = min(self.min_ns, lo)
        self.max_ns = max(self.max_ns, hi)
        self.samples += samples
        self.gil_busy += busy
        if self.spec is None:
            self.spec = spec
