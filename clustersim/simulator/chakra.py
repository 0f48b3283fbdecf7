"""One simulated iteration as Chakra execution traces, the format ASTRA-sim and its peers read.

One ``.et`` file per rank class (``NAME.0.et`` the representative rank; ``NAME.1.et`` the slowest
rank where there are stragglers; with pipeline stages one per stage, ``NAME.s.et``, and the slowest
replica's stage s as ``NAME.(p+s).et``): a stream of length-prefixed protobuf messages, a GlobalMetadata
then one Node per op, as Chakra's own tools write them (schema: mlcommons/chakra
schema/protobuf/et_def.proto; attribute names as its converters use: ``is_cpu_op``, ``comm_type``,
``comm_size``). Compute and copies are COMP_NODEs with their simulated duration; collectives are
COMM_COLL_NODEs with their op and bytes, so the other simulator prices the network itself. A node's
data dependencies are the op's own, its control dependency the previous op on its stream (CUDA-stream
order). The encoder is written here (protobuf's wire format: varints and length-delimited fields) so
that no protobuf package is needed.
"""

from __future__ import annotations

from pathlib import Path

from clustersim.errors import InputError
from clustersim.identifiers import Category
from clustersim.io import write_text_atomically

VERSION = "0.0.4"  # the ET schema version Chakra's generators write in GlobalMetadata
COMP_NODE, COMM_COLL_NODE = 4, 7  # et_def.proto NodeType
COMM_TYPE = {"all_reduce": 0, "all_gather": 2, "broadcast": 5, "all_to_all": 6, "reduce_scatter": 7}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _uint(field: int, value: int) -> bytes:
    return _key(field, 0) + _varint(int(value))


def _bytes(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _packed(field: int, values) -> bytes:
    return _bytes(field, b"".join(_varint(int(v)) for v in values)) if values else b""


def _attr(
    name: str, *, int64: int | None = None, boolean: bool | None = None, text: str | None = None
) -> bytes:
    body = _bytes(1, name.encode())
    if int64 is not None:
        body += _uint(9, int64)
    if boolean is not None:
        body += _uint(27, int(boolean))
    if text is not None:
        body += _bytes(29, text.encode())
    return body


def _collective(rec) -> bool:
    return rec.category == Category.COMMUNICATION and rec.meta.get("op") in COMM_TYPE


def _node(i: int, rec, ctrl: list[int], data: list[int]) -> bytes:
    coll = _collective(rec)
    body = _uint(1, i) + _bytes(2, rec.name.encode()) + _uint(3, COMM_COLL_NODE if coll else COMP_NODE)
    body += _packed(4, ctrl) + _packed(5, data)
    body += _uint(6, round(rec.start * 1e6)) + _uint(7, round((rec.end - rec.start) * 1e6))
    attrs = [_attr("is_cpu_op", boolean=rec.stream == "host")]
    if coll:
        attrs += [
            _attr("comm_type", int64=COMM_TYPE[rec.meta["op"]]),
            _attr("comm_size", int64=round(rec.meta.get("bytes", 0))),
            _attr("algorithm", text=str(rec.meta.get("algorithm", ""))),
        ]
    return body + b"".join(_bytes(10, a) for a in attrs)


def _message(body: bytes) -> bytes:
    return _varint(len(body)) + body


def write_chakra(result, folder: Path, name: str | None = None) -> list[Path]:
    """Write one .et file per rank class of ``result`` (its main step) into ``folder``."""
    folder = Path(folder)
    name = name or result.scenario
    ops = result.ops
    ranks = sorted({r.rank for r in ops}) or [0]
    par = result.extra.get("parallelism")
    stages = bool(par and par.get("stages"))

    def shared(rec, rank: int) -> bool:
        """A collective of another op rank that this one takes part in. Data-parallel rank classes:
        every collective (one op waits for both). Pipeline stages: a stage's tensor-parallel
        collectives and sends are its own; a collective is shared only where it waits for ops of both
        ranks (the data-parallel all-reduce of a stage and its twin in the slowest replica)."""
        if not ("op" in rec.meta and rec.meta.get("ranks")):
            return False
        if not stages:
            return True
        waits_for = {ops[d].rank for d in rec.deps}
        return rank in waits_for and rec.rank in waits_for

    blobs: list[tuple[Path, bytes]] = []
    for rank in ranks:
        keep = [i for i, r in enumerate(ops) if r.rank == rank or shared(r, rank)]
        kept = set(keep)
        last_on: dict[str, int] = {}
        blob = _message(_bytes(1, VERSION.encode()))
        for i in keep:
            rec = ops[i]
            ctrl = [last_on[rec.stream]] if rec.stream in last_on else []
            data = [d for d in rec.deps if d in kept]
            blob += _message(_node(i, rec, ctrl, data))
            last_on[rec.stream] = i
        blobs.append((folder / f"{name}.{rank}.et", blob))
    # Each file atomically, and none of them when one fails (a full disk): half a set of rank classes
    # is as misleading to the simulator that reads them as half a file.
    written: list[Path] = []
    try:
        for path, blob in blobs:
            write_text_atomically(path, blob)
            written.append(path)
    except InputError:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return written
