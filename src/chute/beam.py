"""Conversion and preprocessing on Apache Beam (the `beam` extra): `pip install 'chute[beam]'`.

`ReadRecords` reads any format chute reads as `(position, record)` pairs, optionally
preprocessed with chute's own transformations; `WriteShards` writes a PCollection of
records (or of those pairs) as `.crec` or ArrayRecord shards with a manifest,
deterministically; `ConvertRecords` does both, and
`convert` runs it as one job (what `chute convert --runner beam` does). See docs/beam.md.
Importing this module imports Apache Beam; `import chute` does not.
"""

from chute._src.storage.convert.beam.run import convert as convert
from chute._src.storage.convert.beam.run import pipeline_options as pipeline_options
from chute._src.storage.convert.beam.transforms import ConvertRecords as ConvertRecords
from chute._src.storage.convert.beam.transforms import ReadRecords as ReadRecords
from chute._src.storage.convert.beam.transforms import WriteShards as WriteShards

__all__ = ["ConvertRecords", "ReadRecords", "WriteShards", "convert", "pipeline_options"]
