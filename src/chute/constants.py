"""Names of the metadata features Grain's record-based pipelines add to elements.

chute's pipelines add none to your elements; the names are here so that code which
refers to them (to drop them, say) keeps running.
"""

DATASET_INDEX = "_dataset_index"
EPOCH = "_epoch"
INDEX = "_index"
RECORD = "_record"
RECORD_KEY = "_record_key"
SEED = "_seed"
META_FEATURES = frozenset([DATASET_INDEX, EPOCH, INDEX, RECORD, RECORD_KEY, SEED])

__all__ = ["DATASET_INDEX", "EPOCH", "INDEX", "META_FEATURES", "RECORD", "RECORD_KEY", "SEED"]
