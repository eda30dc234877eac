"""Conversion on Apache Beam: the PTransforms, shard writing and the `--runner beam` job."""
