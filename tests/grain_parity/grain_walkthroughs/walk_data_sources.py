"""Data sources, as in Grain's data source guides: an in-memory sequence, an ArrayRecord
file read through `grain.sources.ArrayRecordDataSource`, and a Parquet file read through
`grain.experimental.ParquetIterDataset`. The files are written here, in a temporary folder.
"""

import json
import os
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
from array_record.python import array_record_module

import chute as grain

CITIES = [{"city": name, "pop": pop} for name, pop in [("Oslo", 7), ("Lima", 10), ("Pune", 7)]]


def in_memory() -> None:
    # Any sequence with __len__ and __getitem__ is a random-access source.
    ds = grain.MapDataset.source(CITIES).map(lambda r: r["city"])
    assert list(ds) == ["Oslo", "Lima", "Pune"]
    ranged = grain.sources.RangeDataSource(start=3, stop=9, step=2)
    assert len(ranged) == 3 and list(grain.MapDataset.source(ranged)) == [3, 5, 7]


def array_record(folder: str) -> None:
    path = os.path.join(folder, "cities.array_record")
    writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
    for row in CITIES * 4:
        writer.write(json.dumps(row).encode())
    writer.close()

    source = grain.sources.ArrayRecordDataSource(path)
    assert len(source) == 12
    assert json.loads(source[1]) == CITIES[1]
    ds = (
        grain.MapDataset.source(source)
        .shuffle(seed=1)
        .map(json.loads)
        .filter(lambda row: row["pop"] > 7)
        .to_iter_dataset()
    )
    assert [row["city"] for row in ds] == ["Lima"] * 4

    # The same source in a DataLoader.
    loader = grain.DataLoader(
        data_source=source,
        sampler=grain.samplers.IndexSampler(
            num_records=len(source),
            shard_options=grain.sharding.NoSharding(),
            shuffle=True,
            num_epochs=1,
            seed=0,
        ),
        worker_count=0,
    )
    assert sorted(json.loads(r)["city"] for r in loader) == sorted(["Oslo", "Lima", "Pune"] * 4)


def parquet(folder: str) -> None:
    path = os.path.join(folder, "cities.parquet")
    table = pa.table(
        {"city": [r["city"] for r in CITIES * 2], "pop": [r["pop"] for r in CITIES * 2]}
    )
    pq.write_table(table, path, row_group_size=2)

    rows = list(grain.experimental.ParquetIterDataset(path))
    assert rows == CITIES * 2  # one dict per row, in file order

    # An iterable source feeds an iterable pipeline, and its iterator checkpoints.
    ds = grain.experimental.ParquetIterDataset(path).map(lambda r: r["pop"]).batch(2)
    assert [b.tolist() for b in ds] == [[7, 10], [7, 7], [10, 7]]
    it = iter(ds)
    next(it)
    state = it.get_state()
    rest = [b.tolist() for b in it]
    again = iter(ds)
    again.set_state(state)
    assert [b.tolist() for b in again] == rest == [[7, 7], [10, 7]]


def main() -> None:
    in_memory()
    with tempfile.TemporaryDirectory() as folder:
        array_record(folder)
        parquet(folder)
    print("ok")


if __name__ == "__main__":
    main()
