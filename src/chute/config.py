"""Process-wide options: `chute.config.update(name, value)`, as in Grain."""

from chute._src.config import get as get
from chute._src.config import update as update

__all__ = ["get", "update"]
