"""Fit the collective model's physical parameters to measured collectives, with their uncertainty.

Measurements at a few group shapes (1-4 nodes, one node, one rank per node) are explained by the
same topology model that predicts any scale: for each measured (op, shape, size) the registered
algorithm gives its latency steps and bandwidth legs (cost_models/collective_algorithms.py), and
the fit finds, per link class, the effective bandwidth (as a factor on the modelled link) and the
per-hop latency, a per-collective launch latency, and per op a bandwidth efficiency and a latency
factor relative to the reference op (all-reduce). Fitting those numbers rather than replaying the
measured table is what lets a 2- and 4-node calibration predict 8 or 64 nodes.

Method: weighted least squares on log(time) (relative error), parameters in log space so they stay
positive, weak log-normal priors centred on the documented defaults so a parameter the data cannot
see (e.g. NVLink latency from a CPU cluster) stays at its default with a wide interval instead of
wandering. The covariance is the inverse Gauss-Newton Hessian, inflated by the reduced chi-square
when the model misfits; ``residual_sigma`` is the scatter of measured medians about the fitted model
(misfit plus the medians' own noise) and ``spread`` the run-to-run spread of one repetition at each
measured size (measured_spread), both added to every prediction's interval, which also widens with how
far a size lies past the largest measured (network_params.SIZE_EXTRAPOLATION_SIGMA) and a group's node
count past the largest measured (network_params.NODE_EXTRAPOLATION_SIGMA). Which algorithm a backend
runs (gloo: ring or halving-doubling? binomial or ring broadcast?) is chosen per op by the fit
residual; NCCL keeps its own choice between ring and tree.

The fit is checked by extrapolation: refit on every shape but the largest, predict the largest,
and record the error and whether the measurements fell inside the predicted P10-P90 band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from pydantic import ValidationError
from scipy.optimize import least_squares

from clustersim.cost_models import collective_algorithms as algos
from clustersim.cost_models.collectives import CollectiveModel
from clustersim.cost_models.network_params import NetworkParams, class_key
from clustersim.errors import InputError
from clustersim.io import first_error
from clustersim.scenario import ClusterSpec
from clustersim.topologies.cluster import GroupShape, build_cluster
from clustersim.units import format_link_rate

Z90 = 1.2815515655446004  # standard normal quantile of 0.9
REFERENCE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
# Prior widths (log-sigma) around the defaults: latencies of software stacks differ from NCCL's
# table by orders of magnitude (gloo over TCP: tens of microseconds per message), so they are left
# nearly free; efficiencies are factors near 1.
PRIOR_SIGMA = {
    "base_s": 3.0,
    "hop_s": 3.0,
    "bw_eff": 1.0,
    "op_bw_eff": 1.0,
    "op_latency_scale": 1.0,
    "pacing_cv": 2.0,
}
# Pacing (closed_forms.paced_factor: a lockstep collective waits for the slowest of N nodes) is told
# apart from bandwidth only by how the per-byte time grows with the node count beyond the algorithm's
# bytes (a ring's 2(N-1)/N), so it needs two node counts of two or more nodes (2 and 4 hosts), and is
# kept only where it explains the data better (as an algorithm is chosen). The fit starts from a small
# spread, not from 0, since the parameters live in log space.
PACING_START = 0.02
PACING_MIN_NODE_COUNTS = 2
MIN_POINT_SIGMA = 0.03  # relative noise floor per measured median (timer, scheduler)
# What a backend is known to run, so not chosen by residual: torch's gloo reduce_scatter is an
# all-reduce with each rank keeping its slice (collective_algorithms.py via_all_reduce: its bytes on the
# wire, measured on the testbed). Its times alone cannot tell it from a ring reduce-scatter whose
# bandwidth efficiency is fitted at one half (a 2+4-host testbed sweep did just that, op_bw_eff 0.49),
# but the bytes it puts on the links (NIC sharing with concurrent all-gathers, bytes per link) differ.
KNOWN_ALGORITHMS = {"gloo": {"reduce_scatter": "via_all_reduce"}}


@dataclass
class Point:
    op: str
    shape: GroupShape
    nbytes: float
    time: float
    sigma: float  # log-sigma of this median
    plans: dict  # algorithm -> Decomposition
    model: CollectiveModel
    inputs: algos.Inputs  # built once: the fit prices every point hundreds of times
    sample_sigma: float | None = None  # one repetition's log-sigma about the median (_sample_sigma)


def _sample_sigma(r: dict) -> float | None:
    """Log-sigma of one timed repetition about its median, from the record's P10-P90 (a lognormal's
    P10-P90 is exp(mu -+ Z90 sigma)); None where the record has no spread."""
    p10, p90 = r.get("p10_s"), r.get("p90_s")
    if not (p10 and p90 and p10 > 0 and p90 >= p10):
        return None
    return (math.log(p90) - math.log(p10)) / (2 * Z90)


def _point_sigma(r: dict) -> float:
    one = _sample_sigma(r)
    # sigma of one sample from its P10-P90, then of the median of `repeats` samples
    spread = 0.0 if one is None else one / math.sqrt(max(int(r.get("repeats") or 1), 1))
    return math.hypot(spread, MIN_POINT_SIGMA) if r["median_s"] > 0 else MIN_POINT_SIGMA


def points_from(records: list[dict], spec: ClusterSpec, source: str) -> list[Point]:
    """Usable measurements (two or more ranks, a known op) with their algorithm decompositions."""
    models: dict[tuple[int, int], CollectiveModel] = {}
    points = []
    for i, r in enumerate(records):
        op = r.get("op")
        if op not in algos.REGISTRY:
            continue
        t, nbytes = r.get("median_s"), r.get("bytes")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (t, nbytes)):
            raise InputError(
                f"collective record {i} ({op}) has a non-positive or non-finite time or size",
                source=source,
                key=f"collectives[{i}]",
            )
        shape = GroupShape(int(r["nodes"]), int(r["gpus_per_node"]))
        if shape.ranks < 2:
            continue
        key = (shape.nodes, shape.gpus_per_node)
        if key not in models:
            cluster = build_cluster(
                spec.model_copy(update={"nodes": max(shape.nodes, 1), "gpus_per_node": shape.gpus_per_node})
            )
            models[key] = CollectiveModel(cluster)
        inputs = algos.Inputs(models[key].cluster, shape, float(nbytes))
        plans = {name: fn(inputs) for name, fn in algos.applicable(op, shape).items()}
        points.append(
            Point(
                op,
                shape,
                float(nbytes),
                float(t),
                _point_sigma(r),
                plans,
                models[key],
                inputs,
                _sample_sigma(r),
            )
        )
    return points


def measured_spread(points: list[Point]) -> dict[str, list[tuple[float, float]]]:
    """Per op, the measured sizes (ascending) with the run-to-run spread measured there: the median
    over the group shapes measured at that size of one repetition's log-sigma (0 where no record had a
    P10-P90). A prediction is one more run: its band holds this spread, not only the fit's parameter
    covariance, which shrinks with the number of points however much each run scatters. On the
    emulated testbed the medians of nine sweeps of one machine scattered between sessions by about
    this much (log-sd of medians / one repetition's log-sigma: 1.16 below 64 KiB, 0.87 at 64 KiB-1 MiB,
    0.94 at 1-8 MiB; benchmarks/network_band_evidence.py)."""
    by: dict[str, dict[float, list[float]]] = {}
    for p in points:
        by.setdefault(p.op, {}).setdefault(p.nbytes, []).append(p.sample_sigma or 0.0)
    return {
        op: [(size, float(np.median(sig))) for size, sig in sorted(sizes.items())] for op, sizes in by.items()
    }


def _classes(points: list[Point], nic_kind: str) -> list[str]:
    seen: list[str] = []
    for pt in points:
        for plan in pt.plans.values():
            names = [c for steps, c in plan.latency_steps if steps > 0] + [
                leg.link.latency_class
                for leg in plan.legs
                if leg.nbytes > 0 and math.isfinite(leg.link.bytes_per_s)
            ]
            for c in names:
                key = class_key(c, nic_kind)
                if key not in seen:
                    seen.append(key)
    return seen


def _defaults(name: str, points: list[Point]) -> float:
    kind, _, key = name.partition(".")
    model = points[0].model
    if kind == "base_s":
        return model.base_latency("Simple")
    if kind == "hop_s":
        latency_class = "network" if key.startswith("net_") else key
        return model.cluster.hop_latency(latency_class, "Simple")
    if kind == "pacing_cv":
        return max(model.cluster.pacing_cv(), PACING_START)
    return 1.0


class _Problem:
    """The parameter vector, the priors and the residual function of one fit."""

    def __init__(
        self,
        points: list[Point],
        names: list[str],
        algorithms: dict[str, str],
        protocols: tuple[str, ...] | None,
    ):
        self.points, self.names, self.algorithms, self.protocols = points, names, algorithms, protocols
        self.x0 = np.log([_defaults(n, points) for n in names])
        self.prior_sigma = np.array([PRIOR_SIGMA[n.partition(".")[0]] for n in names])
        self.log_t = np.log([p.time for p in points])
        self.sigma = np.array([p.sigma for p in points])

    def params(self, x) -> NetworkParams:
        base = NetworkParams(algorithms=dict(self.algorithms), protocols=self.protocols)
        return base.with_values(self.names, np.exp(x))

    def predict(self, params: NetworkParams) -> np.ndarray:
        out = np.empty(len(self.points))
        for i, pt in enumerate(self.points):
            pt.model.params = params
            algo = self.algorithms.get(pt.op)
            plans = (
                {algo: pt.plans[algo]}
                if algo in pt.plans
                else {k: v for k, v in pt.plans.items() if k in algos.NCCL_AUTO[pt.op]}
            )
            protocols = params.protocols or pt.model._protocols(pt.shape)
            fastest = min(
                pt.model.price(pt.op, a, proto, plan, pt.inputs).time
                for a, plan in plans.items()
                for proto in protocols
            )
            # a draw's scatter, the same for every algorithm and protocol (price leaves it out)
            out[i] = fastest * params.scatter(pt.op, pt.inputs.nbytes, nodes=pt.shape.nodes)
            if params.floors is not None:  # a draw (calibrate check's band): never under the wire's time
                out[i] = max(out[i], pt.model.draw_floor(pt.op, pt.inputs.nbytes, pt.shape, algo or "auto"))
        return out

    def residuals(self, x) -> np.ndarray:
        data = (np.log(self.predict(self.params(x))) - self.log_t) / self.sigma
        prior = (x - self.x0) / self.prior_sigma
        return np.concatenate([data, prior])

    def solve(self):
        # soft-L1: a median that a stalled TCP connection made 40% slow pulls the fit a little, not a lot
        res = least_squares(
            self.residuals,
            self.x0,
            method="trf",
            x_scale=1.0,
            diff_step=1e-4,
            max_nfev=400,
            loss="soft_l1",
            f_scale=3.0,
        )
        n, k = len(self.points), len(self.names)
        data_r = (np.log(self.predict(self.params(res.x))) - self.log_t) / self.sigma
        # Robust scale of the weighted residuals (MAD), so a few outliers do not widen every band.
        scale = 1.4826 * float(np.median(np.abs(data_r))) * math.sqrt(n / max(n - k, 1))
        # The data's information is discounted by their misfit (scale > 1: the medians scatter more than
        # their own spreads say); the priors' is not. Inflating the prior rows too let a parameter the
        # data cannot see (gloo's launch latency under a 230 µs TCP hop) drift to 0.7 s in the draws.
        jac_data, jac_prior = res.jac[:n], res.jac[n:]
        info = jac_data.T @ jac_data / max(1.0, scale**2) + jac_prior.T @ jac_prior
        try:
            cov = np.linalg.inv(info)
        except np.linalg.LinAlgError:
            cov = np.diag(self.prior_sigma**2)
        log_resid = data_r * self.sigma
        resid_sigma = 1.4826 * float(np.median(np.abs(log_resid))) * math.sqrt(n / max(n - k, 1))
        return res.x, cov, resid_sigma, float(res.cost)


def _free_names(points: list[Point], classes: list[str]) -> list[str]:
    names = ["base_s"]
    for c in classes:
        names += [f"hop_s.{c}", f"bw_eff.{c}"]
    ops = sorted({p.op for p in points}, key=REFERENCE_OPS.index)
    for op in ops[1:]:
        names.append(f"op_bw_eff.{op}")
        if len({p.shape.ranks for p in points if p.op == op}) > 1:
            names.append(f"op_latency_scale.{op}")
    return names


def _fit(points: list[Point], backend: str, nic_kind: str) -> tuple[NetworkParams, dict]:
    classes = _classes(points, nic_kind)
    names = _free_names(points, classes)
    protocols = ("Simple",) if backend != "nccl" else None
    algorithms: dict[str, str] = {}
    known = KNOWN_ALGORITHMS.get(backend, {})
    if backend != "nccl":
        # One algorithm per op, chosen by the fit: start from ring, try the others op by op.
        for op in sorted({p.op for p in points}):
            common = set.intersection(*(set(p.plans) for p in points if p.op == op))
            algorithms[op] = (
                known[op] if known.get(op) in common else "ring" if "ring" in common else sorted(common)[0]
            )
    problem = _Problem(points, names, algorithms, protocols)
    best = problem.solve()
    for op in [op for op in algorithms if op not in known]:
        common = set.intersection(*(set(p.plans) for p in points if p.op == op))
        for alt in sorted(common - {algorithms[op]}):
            trial = _Problem(points, names, {**algorithms, op: alt}, protocols)
            result = trial.solve()
            if result[3] < best[3] * 0.98:
                problem, best, algorithms = trial, result, {**algorithms, op: alt}
    pacing = f"pacing_cv.{class_key('network', nic_kind)}"
    if len({p.shape.nodes for p in points if p.shape.nodes > 1}) >= PACING_MIN_NODE_COUNTS:
        trial = _Problem(points, [*names, pacing], algorithms, protocols)
        result = trial.solve()
        if result[3] < best[3] * 0.98:
            problem, best, names = trial, result, [*names, pacing]
    x, cov, resid_sigma, _ = best
    params = problem.params(x)
    stats = {
        "names": names,
        "x": x,
        "cov": cov,
        "residual_sigma": resid_sigma,
        "classes": classes,
        "algorithms": algorithms,
        "protocols": protocols,
        "spread": measured_spread(points),
        "nodes": sorted({p.shape.nodes for p in points}),
    }
    return params, stats


def predict_interval(
    params: NetworkParams, point: Point, samples: list[NetworkParams]
) -> tuple[float, float, float]:
    """P10, P50, P90 of one point's time under sampled parameters."""
    pr = _Problem([point], [], params.algorithms, params.protocols)
    times = np.array([pr.predict(s)[0] for s in samples])
    return tuple(float(v) for v in np.quantile(times, [0.1, 0.5, 0.9]))  # type: ignore[return-value]


def check_holdout(
    train: list[Point],
    test: list[Point],
    backend: str,
    nic_kind: str,
    samples: int = 200,
    floored: bool = True,
) -> list[dict]:
    """Fit on ``train``, predict every point of ``test``: one row per test point with the measured and
    predicted time, the predicted P10-P90 and the relative error. ``floored=False``: the draws' own
    spread, none stopped at the time its bytes take at the line rate (as a run's are: CollectiveModel
    .floor), for measuring how wide that spread must be (benchmarks/network_band_evidence.py)."""
    _, stats = _fit(train, backend, nic_kind)
    calibrated = _as_params(stats, "holdout check")
    draws = calibrated.sample(np.random.default_rng(0), samples)
    if not floored:
        draws = [replace(d, floors=None) for d in draws]
    rows = []
    for pt in test:
        p10, _, p90 = predict_interval(calibrated, pt, draws)
        pred = _Problem([pt], [], calibrated.algorithms, calibrated.protocols).predict(calibrated)[0]
        rows.append(
            {
                "op": pt.op,
                "nodes": pt.shape.nodes,
                "gpus_per_node": pt.shape.gpus_per_node,
                "bytes": pt.nbytes,
                "measured_s": pt.time,
                "predicted_s": float(pred),
                "p10_s": p10,
                "p90_s": p90,
                "error": float(pred / pt.time - 1),
                "inside": bool(p10 <= pt.time <= p90),
            }
        )
    return rows


def summarize_check(rows: list[dict]) -> dict:
    """Median and largest |error| and P10-P90 coverage, overall and per op."""

    def stats(sel: list[dict]) -> dict:
        err = np.abs([r["error"] for r in sel])
        return {
            "points": len(sel),
            "median_abs_rel_error": float(np.median(err)),
            "max_abs_rel_error": float(err.max()),
            "p10_p90_coverage": sum(r["inside"] for r in sel) / len(sel),
        }

    out = stats(rows)
    out["by_op"] = {op: stats([r for r in rows if r["op"] == op]) for op in sorted({r["op"] for r in rows})}
    return out


def _extrapolation(points: list[Point], backend: str, nic_kind: str) -> dict | None:
    ranks = sorted({p.shape.ranks for p in points})
    if len(ranks) < 3:  # the held-out fit needs two rank counts of its own to separate latency from launch
        return None
    largest = ranks[-1]
    train = [p for p in points if p.shape.ranks < largest]
    test = [p for p in points if p.shape.ranks == largest]
    summary = summarize_check(check_holdout(train, test, backend, nic_kind))
    return {
        "fitted_on_ranks": sorted({p.shape.ranks for p in train}),
        "predicted_ranks": largest,
        "points": summary["points"],
        "median_abs_rel_error": summary["median_abs_rel_error"],
        "max_abs_rel_error": summary["max_abs_rel_error"],
        "p10_p90_coverage": summary["p10_p90_coverage"],
        "by_op": {op: v["median_abs_rel_error"] for op, v in summary["by_op"].items()},
    }


def _as_params(stats: dict, source: str) -> NetworkParams:
    base = NetworkParams(
        algorithms=stats["algorithms"],
        protocols=stats["protocols"],
        source=source,
        calibrated=True,
        names=tuple(stats["names"]),
        log_mean=tuple(float(v) for v in stats["x"]),
        log_cov=tuple(tuple(float(v) for v in row) for row in stats["cov"]),
        residual_sigma=stats["residual_sigma"],
        calibrated_classes=tuple(stats["classes"]),
        spread={op: tuple(table) for op, table in stats["spread"].items()},
        measured_nodes=tuple(stats["nodes"]),
    )
    return base.with_values(stats["names"], np.exp(stats["x"]))


# The catalog device that stands for "the CPU" of a CPU-only calibration (gloo between hosts).
CPU_DEVICE = "CPU-2vCPU"


# How far --cluster's NIC line rate may lie from the rate a raw file records before the two are taken for
# different links: 1%. The fit takes any ratio between them for the links' efficiency (bw_eff), so it
# moves every prediction on other links by that ratio; 1% is under a quarter of what the emulated
# testbed's medians moved between sessions (log-sd 0.044 at 1-8 MiB, docs/calibration.md) and holds a
# rate written to fewer figures (0.1995 against 0.2 Gb/s).
LINK_RATE_TOLERANCE = 0.01


def recorded_networks(raw: dict) -> list[tuple[str, dict]]:
    """The network a raw file says its sweep ran over, as (key of its rate, {kind, line_rate_gbps}) for
    each place that records one: the testbed's own record (``provenance.testbed``) and the sweep's
    ``topology.network``."""
    prov = raw.get("provenance") if isinstance(raw.get("provenance"), dict) else {}
    topology = raw.get("topology") if isinstance(raw.get("topology"), dict) else {}
    found = []
    places = (("provenance.testbed", prov.get("testbed")), ("topology.network", topology.get("network")))
    for key, net in places:
        rate = net.get("line_rate_gbps") if isinstance(net, dict) else None
        if isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0:
            kind = net.get("kind") if isinstance(net.get("kind"), str) else None
            found.append((f"{key}.line_rate_gbps", {"kind": kind, "line_rate_gbps": float(rate)}))
    return found


def refuse_contradicting_cluster(raw: dict, cluster: ClusterSpec, raw_name: str = "the raw file") -> None:
    """--cluster describes the links the sweep ran on: one whose NIC kind or line rate (beyond
    LINK_RATE_TOLERANCE) differs from the network ``raw`` records is refused, naming both; a fit against
    it would take the difference for the links' efficiency and misprice every cluster it is applied to."""
    nic = cluster.nic
    for key, net in recorded_networks(raw):
        rate, kind = net["line_rate_gbps"], net["kind"]
        if abs(nic.line_rate_gbps - rate) <= LINK_RATE_TOLERANCE * rate and kind in (None, nic.kind):
            continue
        ratio = max(rate, nic.line_rate_gbps) / min(rate, nic.line_rate_gbps)
        theirs = f"{kind + ' at ' if kind else ''}{format_link_rate(rate)}"
        raise InputError(
            f"its NIC is {nic.kind} at {format_link_rate(nic.line_rate_gbps)}, but {raw_name} records that "
            f"its sweep ran over {theirs} ({key})"
            + (f", {ratio:,.3g}x apart" if ratio > 1 + LINK_RATE_TOLERANCE else "")
            + ": the fit would take the difference for the links' efficiency and misprice every cluster; "
            "leave --cluster out (the file records its network) or set its cluster.nic to "
            f"kind {kind or nic.kind}, line_rate_gbps {rate:g}",
            key="--cluster",
        )


def measured_cluster(
    raw: dict, override: ClusterSpec | None = None, raw_name: str = "the raw file"
) -> ClusterSpec | None:
    """The cluster a raw file was measured on: ``override`` (``--cluster``), else what the sweep
    recorded about its network (the emulated testbed records its NIC kind and shaped rate). None when
    unknown: then only exact-shape fits are made, since efficiencies need the modelled links. An
    override that contradicts the recorded network is refused (refuse_contradicting_cluster)."""
    if override is not None:
        refuse_contradicting_cluster(raw, override, raw_name)
        return override
    topo = raw.get("topology") or {}
    net = topo.get("network")
    if not isinstance(net, dict) or not net.get("kind") or not net.get("line_rate_gbps"):
        return None
    device = (raw.get("provenance") or {}).get("catalog_device") or raw.get("device_name")
    if raw.get("device") == "cpu" or not device:
        device = CPU_DEVICE
    data = {
        "nodes": topo.get("nodes") or 1,
        "gpus_per_node": topo.get("gpus_per_node") or 1,
        "gpu": device,
        "intra_node": {"fabric": "pcie"},
        "nic": {
            "kind": net["kind"],
            "count": 1,
            "line_rate_gbps": net["line_rate_gbps"],
            "gpudirect_rdma": False,
        },
    }
    try:  # the scenario's own cluster schema: the measured NIC is checked as a scenario's is
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        key, msg = first_error(exc)
        raise InputError(msg, key=f"topology ({key})") from None


def fit_network(records: list[dict], spec: ClusterSpec, backend: str, source: str) -> dict | None:
    """The profile's ``network`` section (a dict) from raw collective records, or None when the
    records hold fewer than two usable points."""
    points = points_from(records, spec, source)
    if len(points) < 2:
        return None
    nic_kind = spec.nic.kind
    _, stats = _fit(points, backend, nic_kind)
    check = _extrapolation(points, backend, nic_kind)
    return {
        "backend": backend,
        "cluster": spec.model_dump(mode="json"),
        "source": source,
        "parameters": {n: float(math.exp(v)) for n, v in zip(stats["names"], stats["x"])},
        "log_covariance": [[float(v) for v in row] for row in stats["cov"]],
        "residual_sigma": stats["residual_sigma"],
        "calibrated_classes": stats["classes"],
        "algorithms": stats["algorithms"],
        "protocols": list(stats["protocols"]) if stats["protocols"] else None,
        "points": len(points),
        "shapes": sorted({(p.shape.nodes, p.shape.gpus_per_node) for p in points}),
        "extrapolation": check,
        "spread": {op: [[size, sigma] for size, sigma in table] for op, table in stats["spread"].items()},
    }
