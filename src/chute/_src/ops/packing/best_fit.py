"""`experimental.BestFitPackIterDataset`: each sequence goes to the tightest bin it fits."""

from __future__ import annotations

from chute._src.ops.packing.bins import PackIterDataset


class BestFitPackIterDataset(PackIterDataset):
    """Packs sequences into rows: each goes to the fullest of the bins it fits (best fit).

    Same arguments, outputs and state as `FirstFitPackIterDataset`; best fit leaves less
    padding when lengths vary a lot. Ties go to the lowest bin, as in Grain.

    >>> import numpy as np, chute
    >>> seqs = [{"t": np.arange(1, n + 1)} for n in (3, 4, 1, 2)]
    >>> ds = chute.experimental.BestFitPackIterDataset(
    ...     chute.MapDataset.source(seqs).to_iter_dataset(),
    ...     length_struct={"t": 5}, num_packing_bins=2, shuffle_bins=False)
    >>> [r["t"].tolist() for r in ds]
    [[1, 2, 3, 1, 2], [1, 2, 3, 4, 1]]
    """

    _first_fit = False
    _name = "BestFitPackIterDataset"
