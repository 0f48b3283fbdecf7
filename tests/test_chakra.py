"""Chakra execution traces: read back with a protobuf wire-format reader written here (not the
encoder's code), checked against the simulated ops."""

from __future__ import annotations

import pytest

from clustersim.cli import app
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
from clustersim.simulator.chakra import write_chakra


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _fields(buf: bytes) -> list[tuple[int, object]]:
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i : i + n], i + n
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.append((field, value))
    return out


def _messages(blob: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(blob):
        n, i = _varint(blob, i)
        out.append(blob[i : i + n])
        i += n
    return out


def _packed(data: bytes) -> list[int]:
    vals, i = [], 0
    while i < len(data):
        v, i = _varint(data, i)
        vals.append(v)
    return vals


def _read(path) -> tuple[dict, list[dict]]:
    msgs = _messages(path.read_bytes())
    meta = dict(_fields(msgs[0]))
    nodes = []
    for m in msgs[1:]:
        node = {"attr": {}, 4: [], 5: []}
        for f, v in _fields(m):
            if f == 10:
                a = dict(_fields(v))
                node["attr"][a[1].decode()] = a.get(9, a.get(27, a.get(29)))
            elif f in (4, 5):
                node[f] = _packed(v)
            else:
                node[f] = v
        nodes.append(node)
    return meta, nodes


def test_an_iteration_reads_back_as_chakra_nodes(tmp_path):
    r = simulate(load_scenario("preset:dgx-h100-gpt3-1.3b"))
    (path,) = write_chakra(r, tmp_path)
    meta, nodes = _read(path)
    assert meta[1] == b"0.0.4"
    assert len(nodes) == len(r.ops)
    ids = [n[1] for n in nodes]
    for n in nodes:
        assert all(d in ids and d < n[1] for d in n[4] + n[5])
    colls = [n for n in nodes if n[3] == 7]
    assert len(colls) == len(r.buckets)
    assert {c["attr"]["comm_type"] for c in colls} == {0}  # ALL_REDUCE
    assert sorted(c["attr"]["comm_size"] for c in colls) == sorted(round(b["bytes"]) for b in r.buckets)
    comp = [n for n in nodes if n[3] == 4]
    total = sum(n.get(7, 0) for n in comp) * 1e-6
    assert total == pytest.approx(
        sum(o.end - o.start for o in r.ops if o.category != "communication"), rel=1e-3
    )


def test_stragglers_give_one_trace_per_rank_class(tmp_path, runner):
    s = load_scenario("preset:dgx-h100-gpt3-1.3b").with_changes(
        **{"cluster.heterogeneity": {"slow_gpus": [{"rank": 5, "compute_factor": 1.3}]}}
    )
    paths = write_chakra(simulate(s), tmp_path)
    assert [p.name for p in paths] == [f"{s.name}.0.et", f"{s.name}.1.et"]
    _, typical = _read(paths[0])
    _, slow = _read(paths[1])
    fwd = [n.get(7, 0) for n in typical if n[2].startswith(b"fwd")]
    fwd_slow = [n.get(7, 0) for n in slow if n[2].startswith(b"fwd")]
    assert sum(fwd_slow) == pytest.approx(1.3 * sum(fwd), rel=0.01)
    bad = runner.invoke(app, ["run", "preset:default", "--chakra", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "--chakra" in bad.output


def test_a_pipeline_stage_trace_holds_its_own_collectives_and_the_shared_data_parallel_ones(tmp_path):
    """With pipeline stages every op rank is one stage (of the typical or the slowest replica). A
    stage's .et used to hold every collective of every stage (each rank's trace replayed all p stages'
    tensor-parallel all-gathers); it holds its own ops, plus the data-parallel collectives its twin
    in the other replica shares with it (one op, waiting for both replicas)."""
    from tests.conftest import make_scenario

    s = make_scenario(
        **{
            "workload.model": "GPT-3-1.3B",
            "workload.micro_batch": 1,
            "workload.seq_len": 512,
            "workload.gradient_accumulation": 4,
            "training.parallelism": {"tensor": 2, "pipeline": 2, "sequence_parallel": True},
            "cluster.heterogeneity": {"slow_gpus": [{"rank": 5, "compute_factor": 1.3}]},
        }
    )
    r = simulate(s)
    p = 2
    paths = write_chakra(r, tmp_path)
    assert [x.name for x in paths] == [f"{s.name}.{k}.et" for k in range(2 * p)]
    foreign = {}
    for rank, path in enumerate(paths):
        _, nodes = _read(path)
        own = [i for i, o in enumerate(r.ops) if o.rank == rank]
        assert [n[1] for n in nodes if r.ops[n[1]].rank == rank] == own
        foreign[rank] = [n for n in nodes if r.ops[n[1]].rank != rank]
        for n in foreign[rank]:  # shared: a collective waiting for this rank's ops and its own rank's
            op = r.ops[n[1]]
            assert n[3] == 7 and {rank, op.rank} <= {r.ops[d].rank for d in op.deps}
    # the slowest replica's stages share their data-parallel all-reduces with the typical replica's
    assert any("data parallel" in r.ops[n[1]].name for n in foreign[p])
    assert not any("tp " in r.ops[n[1]].name for k in foreign for n in foreign[k])
