"""requirements/test.lock, which .ci/run installs, stays in step with pyproject.toml: every
test dependency is pinned to one exact version, inside the range pyproject.toml gives, and
chute's own dependencies stay ranges (users get no pins)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in (REPO / "requirements" / "test.lock").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        assert m, f"requirements/test.lock: {line!r} is not an exact pin (name==version)"
        found[canonicalize_name(m[1])] = Version(m[2])
    return found


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_every_test_dependency_is_pinned_inside_its_range() -> None:
    locked = pins()
    extras = project()["optional-dependencies"]
    for text in [*project()["dependencies"], *extras["test"]]:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is a test dependency but not in the lock: bash .ci/lock"
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"the lock pins {req.name}=={locked[name]}, outside pyproject.toml's {req}: "
            "bash .ci/lock"
        )
    for tool in ("pip", "setuptools", "wheel"):  # .ci/run's installers are locked too
        assert tool in locked


def test_users_get_ranges_not_pins() -> None:
    for text in project()["dependencies"]:
        assert "==" not in text, f"chute's own dependency {text!r} must be a range"
