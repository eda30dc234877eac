"""Process-wide options: `chute.config.update(name, value)`, as in Grain."""

from chute._src.core.config import get as get
from chute._src.core.config import get_or_default as get_or_default
from chute._src.core.config import update as update

__all__ = ["get", "get_or_default", "update"]
