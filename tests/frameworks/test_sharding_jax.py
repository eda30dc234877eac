"""shard_by_jax_process with a real JAX: standalone, and a real 2-process distributed run."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest

import chute


def test_standalone_run_raises_value_error_as_seed_000_expects() -> None:
    with pytest.raises(
        ValueError, match=r"not a JAX distributed run.*jax\.distributed\.initialize"
    ):
        chute.sharding.shard_by_jax_process()
    options = chute.sharding.ShardByJaxProcess()
    assert (options.shard_index, options.shard_count) == (0, 1)


_WORKER = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.distributed.initialize(
        coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2])
    )
    import chute
    options = chute.sharding.shard_by_jax_process(drop_remainder=True)
    loader = chute.DataLoader(
        data_source=list(range(21)),
        sampler=chute.IndexSampler(21, shuffle=True, seed=4, num_epochs=1),
        shard_options=options,
        num_threads=0,
    )
    print(json.dumps([options.shard_index, options.shard_count, list(loader)]))
    jax.distributed.shutdown()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_jax_processes_read_disjoint_shards() -> None:
    address = f"127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, address, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
        )
        for i in range(2)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted((o[0], o[1]) for o in outs) == [(0, 2), (1, 2)]
    a, b = outs[0][2], outs[1][2]
    assert len(a) == len(b) == 10 and not set(a) & set(b)
