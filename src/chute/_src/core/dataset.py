"""The two dataset types, `MapDataset` (random access) and `IterDataset` (iterable), and
what the engine uses beside them, in one import."""

from chute._src.core.iter_dataset import IterDataset as IterDataset
from chute._src.core.map_dataset import MapDataset as MapDataset
from chute._src.core.map_dataset import Stackable as Stackable
from chute._src.core.node import INFINITE as INFINITE
from chute._src.core.node import SEED_TAG_RANDOM_MAP as SEED_TAG_RANDOM_MAP
from chute._src.core.node import SEED_TAG_SHUFFLE as SEED_TAG_SHUFFLE
from chute._src.core.node import rewrite as rewrite
from chute._src.core.node import walk as walk

__all__ = [
    "INFINITE",
    "SEED_TAG_RANDOM_MAP",
    "SEED_TAG_SHUFFLE",
    "IterDataset",
    "MapDataset",
    "Stackable",
    "rewrite",
    "walk",
]
