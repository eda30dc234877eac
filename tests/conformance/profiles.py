"""The suite's budgets: hypothesis settings profiles, chosen by CHUTE_CONFORMANCE.

- "chute-conformance-ci" (the default): derandomized, so every run draws the same cases
  (reproducible in CI), a few minutes on a 2-core machine.
- "chute-conformance-long" (CHUTE_CONFORMANCE=long): random draws, many more examples;
  `tests/conformance/run_long.sh` repeats it with new seeds for about an hour, with a log.

No example database is kept: a failure found becomes an explicit example in the code
(`known_defects.py` while it is open, `test_conformance.py`'s @example once fixed).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

LONG = os.environ.get("CHUTE_CONFORMANCE") == "long"
PROFILE = "chute-conformance-long" if LONG else "chute-conformance-ci"

_common = dict(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)
settings.register_profile("chute-conformance-ci", derandomize=True, **_common)  # type: ignore[arg-type]
settings.register_profile("chute-conformance-long", derandomize=False, **_common)  # type: ignore[arg-type]


def budget(ci: int, long: int) -> settings:
    """The profile's settings with `ci` examples (or `long` under CHUTE_CONFORMANCE=long)."""
    return settings(settings.get_profile(PROFILE), max_examples=long if LONG else ci)
