"""Collective algorithms expanded into steps of flows between ranks (the flow backend's input).

A pattern is a list of parts that run concurrently (the collective takes the longest); a part is a
list of phases run one after another; a phase is a set of flows that start together (a step of the
algorithm), ``repeat`` times. Flow sizes are in units of the collective's bytes S, so one pattern
serves every message size: the makespan scales with S.

Ranks are node-contiguous (rank = node * g + local), ``sharing`` communicators run at once on
disjoint GPUs of every node (communicator j holds local GPUs j*g .. j*g+g-1). NCCL-like channels:
a communicator spanning nodes runs one ring (or tree pair) per NIC it owns, each carrying 1/k of the
data, entering and leaving a node at the member GPUs nearest that NIC (NCCL's ring search). Phases
that stay inside a node are simulated on node 0 only: nodes share no intra-node link.

Formulas: Thakur, Rabenseifner & Gropp 2005 (ring, recursive halving/doubling, pairwise exchange,
binomial tree); NCCL's double binary tree (Sanders, Speck & Träff 2009) for the tree all-reduce;
algorithms.md sec. 6.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clustersim.cost_models.nccl_trees import double_tree
from clustersim.simulator.network.fabric import FlowNetwork
from clustersim.topologies.cluster import GroupShape

# All-to-all across N nodes has N-1 node shifts, all posted at once. Beyond this many, the shifts
# are merged by the leaves they cross (one per distance mod leaves, weighted by how many it stands
# for) while there are at most this many leaves, else this many evenly spaced ones stand for all N-1
# (a sampling choice for speed, not a model constant).
MAX_SHIFTS = 32
# Up to this many nodes the merge by leaves is used on leaves of unequal size too, where it is close
# but not exact; beyond, its flows finish at many different times (each a max-min round: 4x the
# serial shifts' time on 1,000 nodes), so the evenly spaced sample is used (a speed choice).
MAX_UNEQUAL_MERGE = 256


@dataclass
class Phase:
    paths: list[list[int]]
    sizes: list[float]  # per flow, in units of S
    repeat: float = 1.0


class NotModelled(Exception):
    """The flow backend has no expansion for this case; the analytical time stands (with a note)."""


def _nics(net: FlowNetwork, j: int, s: int) -> list[int]:
    """The NICs communicator ``j`` of ``s`` sharing a node uses, one channel each."""
    if net.nics == 0:
        return []
    if s >= net.nics:
        return [j * net.nics // s]
    k = net.nics // s
    return [j * k + c for c in range(k)]


def _rail(net: FlowNetwork, gpu: int) -> int:
    """The NIC of a GPU's rail (its PCIe-nearest NIC in a DGX-like node)."""
    return gpu * net.nics // net.cluster.spec.gpus_per_node


def _ends(net: FlowNetwork, members: list[int], nic: int) -> tuple[int, int]:
    """The members a channel through ``nic`` enters and leaves a node by: the ones nearest the NIC.
    Where several are equally near (two GPUs and two NICs on one PCIe switch), the choice rotates
    with the NIC, so two NICs' channels do not leave by the same GPU's PCIe link."""
    near = [m for m in net.nearest_gpus(nic) if m in members]
    if len(near) == 1:
        return near[0], near[0]
    dist = [len(net._local(f"gpu{m}", f"nic{nic}", True)) for m in near]
    ties = [m for m, d in zip(near, dist) if d == dist[0]]
    if len(ties) == 1:
        return near[1], near[0]
    leave = ties[nic % len(ties)]
    return ties[(nic + 1) % len(ties)], leave


def _order(net: FlowNetwork, members: list[int], nic: int, load: dict | None = None) -> list[int]:
    """A node's members in ring order for the channel through ``nic``: entering at one member nearest
    the NIC, through the others, leaving at another (NCCL's ring search)."""
    if len(members) == 1:
        return members
    enter, leave = _ends(net, members, nic)
    if net.cluster.spec.intra_node.fabric == "nvlink_mesh":
        path = _mesh_path(net, members, enter, leave, {} if load is None else load)
        if path is not None:
            return path
    return [enter] + [m for m in members if m not in (enter, leave)] + [leave]


def _mesh_path(net: FlowNetwork, members: list[int], enter: int, leave: int, load: dict) -> list[int] | None:
    """A path over direct NVLinks from ``enter`` through every member to ``leave`` (NCCL's ring inside
    a DGX-1 node follows NVLinks), or None. Among all such paths, the one whose links are least
    loaded (load / capacity) by the paths already chosen for this communicator's other channels, so
    that channels spread over the mesh as NCCL's do."""
    g = net.graph
    paths: list[list[int]] = []

    def extend(path: list[int]) -> None:
        if len(path) == len(members):
            if path[-1] == leave:
                paths.append(path)
            return
        for m in members:
            last = m != leave or len(path) == len(members) - 1
            if m not in path and last and g.has_edge(f"gpu{path[-1]}", f"gpu{m}"):
                extend([*path, m])

    extend([enter])
    if not paths:
        return None

    def cost(path: list[int]) -> float:
        return max(
            (load.get(e, 0.0) + 1) / g.edges[f"gpu{e[0]}", f"gpu{e[1]}"]["capacity"]
            for e in zip(path, path[1:])
        )

    best = min(paths, key=cost)
    for e in zip(best, best[1:]):
        load[e] = load.get(e, 0.0) + 1
    return best


def _route(net: FlowNetwork, a: tuple[int, int], b: tuple[int, int], nic: int | None) -> list[int]:
    """GPU a=(node, gpu) -> GPU b; across nodes through ``nic`` (a's rail if None), relaying over the
    node's fabric to and from the GPUs nearest the NIC when a or b is not one (NCCL's PXN)."""
    (n1, x), (n2, y) = a, b
    if n1 == n2:
        return net.intra(n1, x, y)
    if nic is None:
        return net.inter(a, b, _rail(net, x))
    return net.inter(a, b, nic)


def _communicators(shape: GroupShape) -> list[list[int]]:
    g = shape.gpus_per_node
    return [[j * g + m for m in range(g)] for j in range(shape.sharing)]


def _mesh_rings(net: FlowNetwork, members: list[int]) -> list[tuple[list[int], float]] | None:
    """Rings over direct NVLinks for ``members`` of one node, with the share of the data each carries,
    or None (not a mesh, fewer than three members, or no ring of direct links).

    NCCL lays several rings (channels) over a DGX-1 mesh. Here the rings and their shares are the
    best any set of rings can do: a linear program over every Hamiltonian cycle of direct links
    (5,040 orders for 8 GPUs) maximising their total rate with no directed link over capacity."""
    spec = net.cluster.spec
    if spec.intra_node.fabric != "nvlink_mesh" or len(members) < 3:
        return None
    key = ("mesh", tuple(members))
    hit = net._paths.get(key)
    if hit is not None:
        return hit or None
    g = net.graph
    cap = {
        (a, b): g.edges[f"gpu{a}", f"gpu{b}"]["capacity"]
        for a in members
        for b in members
        if a != b and g.has_edge(f"gpu{a}", f"gpu{b}")
    }
    cycles: list[list[int]] = []
    first = members[0]

    def extend(path: list[int]) -> None:
        if len(path) == len(members):
            if (path[-1], first) in cap:
                cycles.append(list(path))
            return
        for m in members:
            if m not in path and (path[-1], m) in cap:
                extend([*path, m])

    extend([first])
    chosen: list[tuple[list[int], float]] = []
    if cycles:
        from scipy.optimize import linprog

        edges = list(cap)
        index = {e: i for i, e in enumerate(edges)}
        use = np.zeros((len(edges), len(cycles)))
        for j, c in enumerate(cycles):
            for e in zip(c, c[1:] + c[:1]):
                use[index[e], j] = 1.0
        scale = max(cap.values())
        lp = linprog(
            -np.ones(len(cycles)), A_ub=use, b_ub=np.array([cap[e] / scale for e in edges]), bounds=(0, None)
        )
        if lp.success and lp.x.sum() > 0:
            total = lp.x.sum()
            chosen = [(cycles[j], x / total) for j, x in enumerate(lp.x) if x > 1e-9 * total]
    net._paths[key] = chosen
    return chosen or None


def ring_step(net: FlowNetwork, shape: GroupShape, closed: bool = True) -> Phase:
    """One step of a ring (``closed``) or of a pipelined chain: every rank sends to the next; a chunk
    is split over the communicator's channels."""
    paths, sizes = [], []
    N, s = shape.nodes, shape.sharing
    for j, members in enumerate(_communicators(shape)):
        if N == 1:
            rings = _mesh_rings(net, members) or [(members, 1.0)]
            hops = len(members) if closed else len(members) - 1
            for ring, share in rings:
                for i in range(hops):
                    paths.append(net.intra(0, ring[i], ring[(i + 1) % len(ring)]))
                    sizes.append(share)
            continue
        nics = _nics(net, j, s)
        load: dict = {}  # NVLink use by this communicator's channels so far (mesh nodes)
        for nic in nics:
            order = _order(net, members, nic, load)
            for n in range(N):
                for a, b in zip(order, order[1:]):
                    paths.append(net.intra(n, a, b))
                    sizes.append(1.0 / len(nics))
                if closed or n + 1 < N:
                    paths.append(net.inter((n, order[-1]), ((n + 1) % N, order[0]), nic))
                    sizes.append(1.0 / len(nics))
    return Phase(paths, sizes)


def tree_allreduce(net: FlowNetwork, shape: GroupShape) -> Phase:
    """Double binary tree, pipelined: every tree edge carries S/2 up (reduce) and S/2 down
    (broadcast), all at once. Across nodes the trees join nodes and a chain joins a node's GPUs."""
    paths, sizes = [], []
    N = shape.nodes
    for j, members in enumerate(_communicators(shape)):
        if N == 1:
            for parent in double_tree(len(members)):
                for c, p in enumerate(parent):
                    if p >= 0:
                        paths += [net.intra(0, members[c], members[p]), net.intra(0, members[p], members[c])]
                        sizes += [0.5, 0.5]
            continue
        nics = _nics(net, j, shape.sharing)
        share = 0.5 / len(nics)
        load: dict = {}
        for nic in nics:
            order = _order(net, members, nic, load)
            for parent in double_tree(N):
                for n in range(N):
                    for a, b in zip(order, order[1:]):
                        paths += [net.intra(n, a, b), net.intra(n, b, a)]
                        sizes += [share, share]
                    q = parent[n]
                    if q >= 0:
                        paths.append(net.inter((n, order[-1]), (q, order[0]), nic))
                        paths.append(net.inter((q, order[-1]), (n, order[0]), nic))
                        sizes += [share, share]
    return Phase(paths, sizes)


def _ranks(shape: GroupShape) -> list[list[tuple[int, int]]]:
    """Each communicator's ranks as (node, GPU), node-contiguous."""
    return [[(n, m) for n in range(shape.nodes) for m in members] for members in _communicators(shape)]


def _exchange(net: FlowNetwork, shape: GroupShape, distance: int, size: float, xor: bool = True) -> Phase:
    """Every rank r sends ``size`` to r xor distance (or r + distance for a shift)."""
    paths, sizes = [], []
    for ranks in _ranks(shape):
        p = len(ranks)
        for r, src in enumerate(ranks):
            peer = r ^ distance if xor else (r + distance) % p
            if peer < p and peer != r:
                paths.append(_route(net, src, ranks[peer], None))
                sizes.append(size)
    return Phase(paths, sizes)


def _pow2(p: int) -> int:
    if p & (p - 1):
        raise NotModelled(f"halving-doubling over {p} ranks (not a power of two)")
    return p.bit_length() - 1


def halving(net: FlowNetwork, shape: GroupShape) -> list[Phase]:
    """Recursive halving (reduce-scatter): distances p/2 .. 1, half the data each round."""
    rounds = _pow2(shape.ranks)
    return [_exchange(net, shape, shape.ranks >> (i + 1), 1.0 / 2 ** (i + 1)) for i in range(rounds)]


def doubling(net: FlowNetwork, shape: GroupShape) -> list[Phase]:
    """Recursive doubling (all-gather): distances 1 .. p/2, twice the data each round."""
    p, rounds = shape.ranks, _pow2(shape.ranks)
    return [_exchange(net, shape, 1 << i, (1 << i) / p) for i in range(rounds)]


def _shifts(net: FlowNetwork, N: int) -> list[tuple[int, float]]:
    """The node shifts an all-to-all over N nodes is simulated with, and how many shifts each stands
    for. All N-1 up to MAX_SHIFTS. Beyond, on at most MAX_SHIFTS leaves L: shift j sends node n to
    leaf (n + j) mod L (and its pod likewise) except where n + j wraps past N, so the shifts with one
    distance mod L load the same leaves' uplinks: one of each, weighted. Exact when the leaves hold
    equal numbers of nodes (N a multiple of L); where they do not, the wrap moves a few flows (within
    2.5% of placement.alltoall_shares on 50-1,000 nodes, where 32 evenly spaced shifts are up to 11%
    off), used up to MAX_UNEQUAL_MERGE nodes. Otherwise MAX_SHIFTS evenly spaced shifts, each
    standing for (N-1)/MAX_SHIFTS (within 3% on 500-1,000 nodes on 32 unequal leaves)."""
    if N - 1 <= MAX_SHIFTS:
        return [(j, 1.0) for j in range(1, N)]
    L = net.leaves
    if L <= MAX_SHIFTS and (N % L == 0 or N <= MAX_UNEQUAL_MERGE):
        return [(c or L, float(len(range(c or L, N, L)))) for c in range(L)]
    shifts = sorted({1 + round(i * (N - 2) / (MAX_SHIFTS - 1)) for i in range(MAX_SHIFTS)})
    return [(j, (N - 1) / len(shifts)) for j in shifts]


def alltoall(net: FlowNetwork, shape: GroupShape) -> list[list[Phase]]:
    """Pairwise exchange, every send posted at once: NCCL's all-to-all is one group of sends and
    receives (ncclGroupStart/End), DeepSpeed's MPI 1-bit exchange posts every Isend/Irecv together. On
    one node, p-1 shifts of S/p. Across nodes two concurrent parts: the node shifts in one phase (each
    GPU sends its g chunks for each peer node along its rail), so on an oversubscribed spine the
    shifts that stay inside a leaf run beside those that cross it (placement.alltoall_shares), and the
    exchange among a node's own GPUs."""
    g, N, p = shape.gpus_per_node, shape.nodes, shape.ranks
    if N == 1:
        return [[_exchange(net, shape, j, 1.0 / p, xor=False) for j in range(1, p)]]
    paths, sizes = [], []
    for j, weight in _shifts(net, N):
        for members in _communicators(shape):
            for n in range(N):
                for m in members:
                    paths.append(_route(net, (n, m), ((n + j) % N, m), None))
                    sizes.append(weight * g / p)
    inter = [Phase(paths, sizes)]
    intra = []
    for j in range(1, g):
        paths, sizes = [], []
        for members in _communicators(shape):
            for i, m in enumerate(members):
                paths.append(net.intra(0, m, members[(i + j) % g]))
                sizes.append(1.0 / p)
        intra.append(Phase(paths, sizes))
    return [inter, intra] if intra else [inter]


def binomial_broadcast(net: FlowNetwork, shape: GroupShape) -> list[Phase]:
    """Binomial tree: in round i the ranks below 2^i send the whole array to rank + 2^i; a transfer
    between nodes is split over the sender's NICs."""
    phases = []
    for i in range(max(0, (shape.ranks - 1).bit_length())):
        d = 1 << i
        paths, sizes = [], []
        for j, ranks in enumerate(_ranks(shape)):
            nics = _nics(net, j, shape.sharing)
            for r in range(min(d, len(ranks) - d)):
                a, b = ranks[r], ranks[r + d]
                if a[0] == b[0]:
                    paths.append(net.intra(a[0], a[1], b[1]))
                    sizes.append(1.0)
                    continue
                members = _communicators(shape)[j]
                for nic in nics:
                    inn, out = _ends(net, members, nic)
                    path = net.intra(a[0], a[1], out) if out != a[1] else []
                    path += net.inter((a[0], out), (b[0], inn), nic)
                    path += net.intra(b[0], inn, b[1]) if inn != b[1] else []
                    paths.append(path)
                    sizes.append(1.0 / len(nics))
        phases.append(Phase(paths, sizes))
    return phases


def hierarchical(net: FlowNetwork, shape: GroupShape) -> list[Phase]:
    """Reduce-scatter inside each node (ring), all-reduce of the 1/g shards across nodes on the g
    rails (one ring per local GPU, through its rail NIC), all-gather inside each node."""
    g, N = shape.gpus_per_node, shape.nodes
    local = GroupShape(1, g, shape.sharing)
    inside = ring_step(net, local)
    inside.sizes = [x / g for x in inside.sizes]
    inside.repeat = g - 1
    paths = []
    for members in _communicators(shape):
        for m in members:
            for n in range(N):
                paths.append(_route(net, (n, m), ((n + 1) % N, m), None))
    rails = Phase(paths, [1.0 / (g * N)] * len(paths), 2 * (N - 1))
    return [inside, rails, inside]


def expand(net: FlowNetwork, op: str, algorithm: str, shape: GroupShape) -> list[list[Phase]]:
    """The pattern of ``op`` run with ``algorithm`` on ``shape`` (parts of serial phases)."""
    p = shape.ranks

    def ring(repeat: float, chunk: float, closed: bool = True) -> list[list[Phase]]:
        step = ring_step(net, shape, closed)
        step.sizes = [x * chunk for x in step.sizes]
        step.repeat = repeat
        return [[step]]

    if algorithm == "ring":
        if op == "all_reduce":
            return ring(2 * (p - 1), 1.0 / p)
        if op in ("all_gather", "reduce_scatter"):
            return ring(p - 1, 1.0 / p)
        if op == "broadcast":
            return ring(1, 1.0, closed=False)
        if op == "all_to_all":
            return alltoall(net, shape)
    if algorithm == "via_all_reduce" and op == "reduce_scatter":
        return ring(2 * (p - 1), 1.0 / p)  # the ring all-reduce's flows (collective_algorithms.py)
    if algorithm == "tree" and op == "all_reduce":
        return [[tree_allreduce(net, shape)]]
    if algorithm == "tree" and op == "broadcast":
        return [binomial_broadcast(net, shape)]
    if algorithm == "hd":
        if op == "all_reduce":
            return [halving(net, shape) + doubling(net, shape)]
        if op == "reduce_scatter":
            return [halving(net, shape)]
        if op == "all_gather":
            return [doubling(net, shape)]
    if algorithm == "hier" and op == "all_reduce":
        return [hierarchical(net, shape)]
    raise NotModelled(f"{op} with {algorithm}")
