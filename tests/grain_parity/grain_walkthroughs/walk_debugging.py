"""Debugging a pipeline, as in Grain's debugging tutorial: switch on debug mode with
`grain.config.update("py_debug_mode", True)` (Grain then logs an execution summary of the
pipeline's stages) and the visualization of the pipeline graph, then run the pipeline.
"""

import logging

import chute as grain


def double(x: int) -> int:
    return 2 * x


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    grain.config.update("py_debug_mode", True)
    grain.config.update("py_dataset_visualization_output_dir", "")
    assert grain.config.get_or_default("py_debug_mode") is True

    ds = (
        grain.MapDataset.range(20)
        .seed(seed=42)
        .shuffle()
        .batch(batch_size=2)
        .map(lambda b: b.sum())
        .to_iter_dataset()
        .map(double)
    )
    it = iter(ds)
    sums = [int(next(it)) for _ in range(10)]
    # Debug mode watches the pipeline; it does not change what it produces.
    assert sum(sums) == 2 * sum(range(20))
    assert all(s % 2 == 0 for s in sums)

    grain.config.update("py_debug_mode", False)
    assert grain.config.get_or_default("py_debug_mode") is False
    assert sorted(int(x) for x in ds) == sorted(sums)
    print("ok")


if __name__ == "__main__":
    main()
