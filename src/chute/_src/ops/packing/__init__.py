"""Packing variable-length sequences into fixed-size rows: first fit, best fit, concat-then-split, and what they share."""
