"""`experimental.FirstFitPackIterDataset`: each sequence goes to the first bin it fits."""

from __future__ import annotations

from chute._src.ops.packing.bins import PackIterDataset


class FirstFitPackIterDataset(PackIterDataset):
    """Packs sequences into rows: each goes to the first of `num_packing_bins` bins it fits.

    When a sequence fits no bin, the non-empty bins are emitted as rows and a new batch of
    bins starts with that sequence. Every packed feature `f` gets `f_segment_ids` (1-based
    per row, 0 in padding) and `f_positions` (0-based in each segment). A sequence longer
    than its row raises, unless `split_long_sequences=True` packs the overflow as further
    segments; nothing is cut silently. Rows are shuffled within a batch unless
    `shuffle_bins=False` (keyed by `seed`, default 0 or the pipeline seed).

    >>> import numpy as np, chute
    >>> seqs = [{"t": np.arange(1, n + 1)} for n in (3, 2, 4, 1)]
    >>> ds = chute.experimental.FirstFitPackIterDataset(
    ...     chute.MapDataset.source(seqs).to_iter_dataset(),
    ...     length_struct={"t": 5}, num_packing_bins=2, shuffle_bins=False)
    >>> rows = list(ds)
    >>> rows[0]["t"], rows[0]["t_segment_ids"], rows[0]["t_positions"]
    (array([1, 2, 3, 1, 2]), array([1, 1, 1, 2, 2], dtype=int32), array([0, 1, 2, 0, 1], dtype=int32))
    >>> rows[1]["t"], rows[1]["t_segment_ids"]
    (array([1, 2, 3, 4, 1]), array([1, 1, 1, 1, 2], dtype=int32))
    """

    _first_fit = True
    _name = "FirstFitPackIterDataset"
