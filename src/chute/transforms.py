"""Transformations as classes; plain functions work wherever these do.

`Map`, `RandomMap` and `Filter` are Grain's names for the same classes.
"""

from chute._src.apply import Transformation as Transformation
from chute._src.apply import Transformations as Transformations
from chute._src.selection_map import DatasetSelectionMap as DatasetSelectionMap
from chute._src.transforms import Batch as Batch
from chute._src.transforms import FilterTransform as FilterTransform
from chute._src.transforms import MapTransform as MapTransform
from chute._src.transforms import MapWithIndex as MapWithIndex
from chute._src.transforms import RandomMapTransform as RandomMapTransform
from chute._src.transforms import TypeConversion as TypeConversion

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
