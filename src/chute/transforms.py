"""Transformations as classes; plain functions work wherever these do.

`Map`, `RandomMap` and `Filter` are Grain's names for the same classes.
"""

from chute._src.core.transforms import Batch as Batch
from chute._src.core.transforms import FilterTransform as FilterTransform
from chute._src.core.transforms import MapTransform as MapTransform
from chute._src.core.transforms import MapWithIndex as MapWithIndex
from chute._src.core.transforms import RandomMapTransform as RandomMapTransform
from chute._src.core.transforms import TypeConversion as TypeConversion
from chute._src.ops.apply import Transformation as Transformation
from chute._src.ops.apply import Transformations as Transformations
from chute._src.ops.selection_map import DatasetSelectionMap as DatasetSelectionMap

Map = MapTransform
RandomMap = RandomMapTransform
Filter = FilterTransform

__all__ = [
    "Batch",
    "DatasetSelectionMap",
    "Filter",
    "FilterTransform",
    "Map",
    "MapTransform",
    "MapWithIndex",
    "RandomMap",
    "RandomMapTransform",
    "Transformation",
    "Transformations",
    "TypeConversion",
]
