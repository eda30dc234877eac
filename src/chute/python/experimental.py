"""Grain's older `grain.python.experimental`: the names of `chute.experimental`."""

from chute.experimental import *  # noqa: F403
from chute.experimental import __all__ as __all__
