"""The emulated multi-host testbed: rate parsing, shaping that really shapes, clean teardown."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.testbed import cpu_share, hosts
from clustersim.testbed.shaping import parse_rate, tbf_burst_bytes


def test_rates_read_as_tc_reads_them():
    assert parse_rate("100mbit") == 1e8
    assert parse_rate("1gbit") == 1e9
    assert parse_rate("1.5Gbit") == 1.5e9
    assert parse_rate("10mbps") == 8e7  # tc: "bps" units are bytes per second
    for bad in ("fast", "100", "-5mbit", "1e300gbit", "1kbit"):
        with pytest.raises(InputError):
            parse_rate(bad)


def test_burst_holds_4ms_of_tokens_and_at_least_two_frames():
    assert tbf_burst_bytes(1e9) == 500_000
    assert tbf_burst_bytes(1e6) == 2 * 1514


def test_without_root_one_line_and_exit_2(runner, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    res = runner.invoke(app, ["testbed", "up", "--hosts", "2", "--rate", "100mbit"])
    assert res.exit_code == 2
    assert "needs root" in res.output and "Traceback" not in res.output


def test_missing_tools_are_named(runner, monkeypatch):
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda t: None if t == "tc" else real(t))
    res = runner.invoke(app, ["testbed", "up", "--hosts", "2", "--rate", "100mbit"])
    assert res.exit_code == 2 and "tc" in res.output and "iproute2" in res.output


def test_bad_rate_and_hosts(runner):
    assert runner.invoke(app, ["testbed", "up", "--hosts", "2", "--rate", "quick"]).exit_code == 2
    assert runner.invoke(app, ["testbed", "up", "--hosts", "1", "--rate", "1gbit"]).exit_code == 2


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--hosts", "1"], "--hosts"),
        (["--optimizers", "adam,lion"], "unknown optimizer 'lion'"),
        (["--model", "cnn"], "unknown model 'cnn'"),
        (["--out", "/nonexistent-cst/x.json"], "does not exist"),
    ],
)
def test_validate_refuses_bad_input_before_any_work(runner, args, expected, monkeypatch):
    """One line and exit 2 before the testbed is touched: a bad --out must not cost minutes of measuring."""
    from clustersim.testbed import validate

    monkeypatch.setattr(validate, "validate", lambda *a, **k: pytest.fail("measured before refusing"))
    r = runner.invoke(app, ["testbed", "validate", *args])
    assert r.exit_code == 2 and expected in r.output and "Traceback" not in r.output, r.output


def _can_make_namespaces() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    probe = subprocess.run(["ip", "netns", "add", "cst-probe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "cst-probe"], capture_output=True)
    return probe.returncode == 0


namespaces = pytest.mark.skipif(
    not _can_make_namespaces(), reason="needs root with network namespaces, ip and tc"
)

THROUGHPUT = r"""
import socket, sys, time
if sys.argv[1] == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("10.77.0.1", 5599)); s.listen(1); c, _ = s.accept(); got, t0 = 0, None
    while True:
        b = c.recv(1 << 20)
        if not b: break
        t0 = t0 or time.perf_counter(); got += len(b)
    print(got * 8 / (time.perf_counter() - t0))
else:
    for _ in range(50):
        try:
            c = socket.create_connection(("10.77.0.1", 5599)); break
        except OSError:
            time.sleep(0.1)
    buf = b"x" * (1 << 20)
    for _ in range(int(sys.argv[2])): c.sendall(buf)
    c.close()
"""


@pytest.fixture
def testbed(tmp_path, monkeypatch):
    """The hosts' CPU share to ask for: the default (the machine's cores divided among the hosts) where
    cgroups are writable, else none, so these tests still run where only namespaces are allowed
    (test_testbed_cpus.py checks the shares themselves, and skips there)."""
    # a prefix of its own: a testbed someone left up (or is using) is neither met nor touched
    monkeypatch.setattr(hosts, "PREFIX", "cstt")
    monkeypatch.setattr(hosts, "STATE_FILE", tmp_path / "state.json")
    yield None if cpu_share.unavailable() is None else 0
    hosts.down()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "cstt-h" not in left


@namespaces
def test_shaped_link_delivers_its_rate_and_down_leaves_nothing(testbed, tmp_path):
    tb, created = hosts.up(2, parse_rate("80mbit"), cpus_per_host=testbed)
    assert created and hosts.up(2, parse_rate("80mbit"), cpus_per_host=testbed)[1] is False  # idempotent
    script = tmp_path / "tput.py"
    script.write_text(THROUGHPUT)
    server = hosts.exec_in("h0", [sys.executable, str(script), "server"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    client = hosts.exec_in("h1", [sys.executable, str(script), "client", "12"])
    assert client.wait(timeout=30) == 0
    out, _ = server.communicate(timeout=30)
    rate = float(out.strip())
    assert 0.75 * 80e6 < rate < 1.05 * 80e6, rate  # TCP goodput just under the shaped rate
    removed = hosts.down()
    assert any(r.startswith("netns:cstt-h") for r in removed) and hosts.load_state() is None
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert "csttbr0" not in links


@namespaces
def test_gloo_collectives_across_two_hosts(testbed, tmp_path):
    from clustersim.testbed import sweep

    tb, _ = hosts.up(2, parse_rate("400mbit"), cpus_per_host=testbed)
    raw = sweep.run(
        tb,
        tmp_path / "raw.json",
        "all_reduce",
        1 << 18,
        1 << 19,
        repeat=3,
        warmup=1,
        subgroups=False,
        timeout_s=120,
    )
    recs = raw["collectives"]
    assert {r["bytes"] for r in recs} == {float(1 << 18), float(1 << 19)}
    assert raw["topology"]["nodes"] == 2 and raw["topology"]["network"]["line_rate_gbps"] == 0.4
    recorded = raw["provenance"]["testbed"]  # what each host computed on, in the raw file
    share = None if testbed == 0 else len(cpu_share.machine_cpus()) / 2
    assert recorded["cpus_per_host"] == share and recorded["machine_cpus"] == len(cpu_share.machine_cpus())
    big = max(recs, key=lambda r: r["bytes"])
    # ring all-reduce of S over 2 hosts sends S/2 each way: at 400 Mbit/s no faster than the wire allows
    assert big["median_s"] > (big["bytes"] / 2) / (0.4e9 / 8)


def test_the_ddp_job_as_a_scenario_has_the_mlps_parameters_and_buckets():
    from clustersim.testbed.validate import Job, scenario_for
    from clustersim.workloads import build_workload

    s = scenario_for(8, 2e8, Job(model="mlp", layers=4, width=512, batch=256))
    assert s.cluster.nodes == 8 and s.cluster.gpu == "CPU-2vCPU" and s.cluster.nic.line_rate_gbps == 0.2
    w = build_workload(s.workload)
    assert w.params == 4 * (512 * 512 + 512)  # torch.nn.Linear(512, 512) x 4: weight and bias
    assert s.training.first_bucket_cap_mb == 1 and s.training.ddp_bucket_cap_mb == 25  # DDP's defaults
    assert scenario_for(8, 2e8, Job(), "binsgdm").training.optimizer == "binsgdm"


@pytest.mark.parametrize("n", [2, 8])
def test_the_zero3_scenario_gathers_each_layer_twice_and_reduces_it_once(n):
    """What FSDP2 does per step on CPU (ddp_job.shard), as the simulator runs it: per layer two blocking
    all-gathers and one reduce-scatter of that layer alone, nothing gathered ahead; with NCCL's ring
    reduce-scatter (no gloo calibration here) that is ZeRO-3's 3Ψ·(n-1)/n per rank."""
    from clustersim.simulator import simulate
    from clustersim.testbed.validate import Job, scenario_for

    job = Job(model="mlp", layers=3, width=256, batch=32)
    s = scenario_for(n, 2e8, job, "zero3")
    assert s.training.sharding.stage == 3 and s.training.optimizer == "adam"
    r = simulate(s, None, uncertainty_samples=0)
    ops = [o for o in r.ops if o.rank == 0 and "op" in o.meta]
    gathers = [o for o in ops if o.meta["op"] == "all_gather"]
    reduces = [o for o in ops if o.meta["op"] == "reduce_scatter"]
    layer = 4 * job.layer_params
    assert [o.meta["bytes"] for o in gathers] == [layer] * 2 * job.layers
    assert [o.meta["bytes"] for o in reduces] == [layer] * job.layers
    assert r.bytes_per_link_kind["inter_node_per_node"] == pytest.approx(3 * 4 * job.params * (n - 1) / n)
    fwd = [o for o in r.ops if o.rank == 0 and o.name.startswith("fwd")]
    for i in range(1, job.layers):  # nothing gathered ahead: layer i's waits for layer i-1's forward
        assert gathers[i].start >= fwd[i - 1].end - 1e-12


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_the_scenario_counts_the_parameters_torch_builds(model):
    torch = pytest.importorskip("torch")
    import argparse

    from clustersim.testbed.ddp_job import build_model
    from clustersim.testbed.validate import Job

    job = Job(model=model, layers=3, width=64, batch=4, seq=16)
    built = build_model(
        torch, argparse.Namespace(**{k: getattr(job, k) for k in ("model", "layers", "width", "heads")})
    )
    assert job.params == sum(p.numel() for p in built.parameters())


COMPRESSED_CHECK = r"""
import argparse, math, sys
import torch, torch.distributed as dist
from clustersim.testbed import compressed_job as cj
from clustersim.testbed.ddp_job import build_model

dist.init_process_group("gloo")
rank, p = dist.get_rank(), dist.get_world_size()
args = argparse.Namespace(model="mlp", layers=2, width=40, batch=4, seq=1, heads=1)
torch.manual_seed(0)
ok = True

# 1-bit Adam: compressed_allreduce equals DeepSpeed's two-level formula computed from every rank's input
opt = cj.OneBitAdam(torch, dist, build_model(torch, args).parameters())
n = opt.size
inputs = [torch.randn(n, generator=torch.Generator().manual_seed(10 + r)) for r in range(p)]
buf = inputs[rank].clone()
opt.compressed_allreduce(buf)
sign = lambda x: x.sign().add(1).bool().float().add(-0.5).mul(2.0)
chunks = []
for j in range(p):
    avg = sum((x.norm() / math.sqrt(n)) * sign(x).view(p, -1)[j] for x in inputs) / p
    chunks.append((avg.norm() / math.sqrt(n // p)) * sign(avg))
ok &= torch.allclose(buf, torch.cat(chunks), rtol=1e-5, atol=1e-6)

# BinSGDM: with m = ±b the quantization is deterministic; the update is the majority of the ranks' signs
opt = cj.BinSGDM(torch, dist, build_model(torch, args).parameters(), lr=1.0)
coins = [torch.rand(opt.size, generator=torch.Generator().manual_seed(20 + r)) for r in range(p)]
signs = [torch.where(c < 0.5, 1.0, -1.0) for c in coins]
opt.b.fill_(1.0)
opt.beta = 1.0  # keep m and b as set: m / b = ±1
opt.m.copy_(signs[rank])
before = opt.flat.clone()
opt.step()
majority = torch.where(torch.stack(signs).sum(0) * 1 > 0, 1.0, -1.0)[: opt.n]
ok &= torch.allclose(before - opt.flat, majority, atol=1e-6)

# 0/1 Adam past its freeze: a local step uses no collective and the ranks drift apart on their own
# gradients; the sync undoes the local steps and applies the same averaged update everywhere
torch.manual_seed(0)
opt = cj.ZeroOneAdam(torch, dist, build_model(torch, args).parameters(), interval=2)
grads = [torch.randn(opt.n, generator=torch.Generator().manual_seed(30 + r)) for r in range(p)]
for step in range(2):
    opt.grad.copy_(grads[rank])
    opt.collectives_s = 0.0
    opt.step()
    gathered = [torch.zeros_like(opt.flat) for _ in range(p)]
    dist.all_gather(gathered, opt.flat.clone())
    same = all(torch.allclose(g, gathered[0], rtol=1e-5, atol=1e-7) for g in gathered)
    ok &= (opt.collectives_s == 0.0 and not same) if step == 0 else (opt.collectives_s > 0 and same)
ok &= float(opt.accumulator.abs().sum()) == 0.0 and opt.lrs == 0.0
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if ok else 1)
"""


@pytest.mark.parametrize("ranks", [2, 3])
def test_compressed_allreduces_in_torch_compute_what_the_algorithms_define(tmp_path, ranks):
    """The 1-bit Adam, BinSGDM and 0/1 Adam exchanges run on the testbed are the algorithms, not just traffic:
    checked against their definitions on loopback gloo (no root needed)."""
    pytest.importorskip("torch")
    script = tmp_path / "check.py"
    script.write_text(COMPRESSED_CHECK)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(ranks),
            "--master-port",
            str(29630 + ranks),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]


@namespaces
def test_validation_on_two_hosts_predicts_every_optimizer(testbed):
    """The CI subset of `testbed validate`: 2 hosts, a small MLP, a small sweep. Each optimizer's step is
    predicted within a factor of 2 (the reference runs are within 1.4; CI machines are shared, and 2 hosts
    on 2 cores scatter), and the compressed all-reduces are no faster than their wire. A missing kernel
    calibration or a misread profile is 3-5x off (a profile named by its chip had its kernels ignored).

    Bytes are not noisy: what DDP and the ZeRO-3 job put on a host's link per step (/proc/net/dev) is what
    their simulated steps send, within 2% (TCP/IP headers under segmentation offload and the step's
    barrier: 0.3% measured). ZeRO-3 on gloo sends twice DDP's bytes, not 1.5x: its reduce-scatter is an
    all-reduce; a layer gathered once instead of twice, a reduce-scatter priced as a ring, or a bucket
    spanning the wrong layers are 25-50% off."""
    from clustersim.testbed.validate import Job, validate

    rate = "400mbit"
    job = Job(model="mlp", layers=2, width=512, batch=128, steps=8)
    result = validate(
        [2],
        rate,
        job,
        ("adam", "onebit-adam", "binsgdm", "zero3"),
        samples=4,
        sweep_bytes=(1 << 12, 1 << 20),
        sweep_repeat=3,
        cpus_per_host=testbed,
    )
    rows = {r["optimizer"]: r for r in result["rows"]}
    assert set(rows) == {"adam", "onebit-adam", "binsgdm", "zero3"}
    for r in rows.values():
        assert 1 / 2 < r["predicted_s"] / r["measured_s"] < 2, r
    wire = parse_rate(rate) / 8
    packed = job.params / 8  # one bit per parameter, sent in each of two phases, half of it each way
    for name in ("onebit-adam", "binsgdm"):
        assert rows[name]["compressed_allreduce_measured_s"] > 2 * (packed / 2) / wire
    fp32 = 4 * job.params  # one fp32 copy of the model; a ring over 2 hosts sends half of what it moves
    expected = {"adam": 2 * fp32 / 2, "zero3": (2 + 2) * fp32 / 2}  # gather twice + all-reduce
    for name, wire_bytes in expected.items():
        assert rows[name]["predicted_wire_sent_bytes"] == pytest.approx(wire_bytes, rel=1e-9)
        assert rows[name]["measured_wire_sent_bytes"] == pytest.approx(wire_bytes, rel=0.02), rows[name]
    assert hosts.load_state() is None  # validate took its testbed down
    assert result["testbed"]["cpus_per_host"] == (None if testbed == 0 else len(cpu_share.machine_cpus()) / 2)


def test_a_gloo_fit_prices_reduce_scatter_as_the_all_reduce_it_is():
    """gloo runs reduce_scatter as an all-reduce (2(p-1)/p·S per rank on the wire, measured on the
    testbed). A gloo calibration knows it: on measurements generated that way (known parameters, 2%
    noise, 2-4 hosts) it keeps via_all_reduce with an efficiency near 1, where a free choice of ring
    had to halve ring's bandwidth (op_bw_eff 0.49 on a real sweep) and put half the bytes on the links."""
    import math

    import numpy as np

    from clustersim.calibration.network_fit import fit_network
    from clustersim.cost_models import collective_algorithms as algos
    from clustersim.cost_models.collectives import CollectiveModel
    from clustersim.cost_models.network_params import NetworkParams
    from clustersim.scenario import ClusterSpec
    from clustersim.topologies.cluster import GroupShape, build_cluster

    spec = ClusterSpec(
        nodes=4,
        gpus_per_node=1,
        gpu="CPU-2vCPU",
        intra_node={"fabric": "pcie"},
        nic={"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 0.2, "gpudirect_rdma": False},
    )
    true = NetworkParams(
        hop_s={"net_ethernet_tcp": 200e-6},  # of the order the testbed's sweeps fit
        bw_eff={"net_ethernet_tcp": 0.93},
        base_s=50e-6,
        algorithms={"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "via_all_reduce"},
        protocols=("Simple",),
    )
    rng, recs = np.random.default_rng(5), []
    for n in (2, 3, 4):
        shape = GroupShape(n, 1)
        model = CollectiveModel(build_cluster(spec.model_copy(update={"nodes": n})), None, true)
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            for k in range(14, 24, 2):
                t = model.cost(op, float(1 << k), shape).time * math.exp(rng.normal(0, 0.02))
                recs.append(
                    {"op": op, "nodes": n, "gpus_per_node": 1, "bytes": float(1 << k), "median_s": t}
                    | {"p10_s": t * 0.975, "p90_s": t * 1.025, "repeats": 1}
                )
    net = fit_network(recs, spec, "gloo", "synthetic")
    assert net["algorithms"]["reduce_scatter"] == "via_all_reduce"
    assert net["parameters"].get("op_bw_eff.reduce_scatter", 1.0) == pytest.approx(1.0, abs=0.1)
    plan = algos.REGISTRY["reduce_scatter"]["via_all_reduce"](
        algos.Inputs(build_cluster(spec), GroupShape(4, 1), 8.0)
    )
    assert plan.inter_node_bytes == 2 * 3 / 4 * 8.0  # the ring all-reduce's bytes, not 3/4 of them


FSDP_LOSS = r"""
import json, sys
import torch
from clustersim.testbed.ddp_job import build_model, model_input
import argparse
args = argparse.Namespace(model=sys.argv[1], layers=2, width=32, heads=2, batch=8, seq=4)
torch.set_num_threads(1)
torch.manual_seed(0)
model = build_model(torch, args)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
x = model_input(torch, args)
for _ in range(int(sys.argv[2])):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
print(json.dumps(model(x).square().mean().item()))
"""


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_the_fsdp_job_trains_as_one_process_does(tmp_path, model):
    """The ZeRO-3 job (FSDP2 over gloo, 2 ranks on loopback, no root needed) trains the model: every
    rank has the same input, so with its parameters gathered from the shards for forward and backward and
    Adam updating each shard, it must land where one process's Adam does (to float rounding). A shard
    gathered wrong, or updated from the wrong slice of the gradient, moves the loss. (The reduction
    itself is invisible here, identical inputs give identical gradients: the 2-host test below checks
    its bytes.)"""
    pytest.importorskip("torch")
    script = tmp_path / "single.py"
    script.write_text(FSDP_LOSS)
    steps = 3  # the job runs --warmup 1 then --steps 2 before its final forward
    single = subprocess.run(
        [sys.executable, str(script), model, str(steps)], capture_output=True, text=True, timeout=120
    )
    assert single.returncode == 0, single.stderr[-2000:]
    out = tmp_path / "fsdp.json"
    # Two fresh-clone CI runs of 5 lost a rank of this job to SIGABRT inside torch/gloo, which tens of
    # runs here never reproduced; a rank killed by a signal gets the job run once more (as the testbed's
    # run_on_hosts does), on another port. Anything else fails at once; the loss is checked as before.
    for attempt in range(2):
        run = subprocess.run(
            [
                *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
                *(
                    "--master-port",
                    str(29640 + len(model) + 10 * attempt),
                    "-m",
                    "clustersim.testbed.ddp_job",
                ),
                *("--mode", "fsdp", "--model", model, "--layers", "2", "--width", "32", "--heads", "2"),
                *("--batch", "8", "--seq", "4", "--warmup", "1", "--steps", "2", "--out", str(out)),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        if run.returncode == 0 or "Signal " not in run.stderr:
            break
    # the head of stderr holds a C++ abort's reason ("terminate called ..."), the tail torchrun's summary
    assert run.returncode == 0, run.stderr[:2000] + " ... " + run.stderr[-1000:]
    import json

    got, want = json.loads(out.read_text())["loss_after"], json.loads(single.stdout)
    assert got == pytest.approx(want, rel=1e-5)


def test_the_back_to_back_probe_refuses_bad_input_before_any_work(tmp_path, capsys):
    """One line and exit 2, before a testbed is touched."""
    from clustersim.testbed import back_to_back

    assert back_to_back.main(["--hosts", "1,8", "--out", str(tmp_path / "p.json")]) == 2
    assert back_to_back.main(["--rates", "fast", "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--hosts" in err[0] and "fast" in err[1]


@namespaces
def test_a_job_that_fails_on_a_host_is_run_again_then_reported_naming_its_error(testbed):
    """run_on_hosts: a host whose process exits with an error is named with its exit code and its own
    last lines (not a host still waiting for it, nor torch's c10d warnings), after one more attempt."""
    from clustersim.testbed.sweep import run_on_hosts

    tb, _ = hosts.up(2, parse_rate("400mbit"), cpus_per_host=testbed)
    with pytest.raises(InputError) as exc:
        run_on_hosts(tb, "clustersim.testbed.no_such_job", [], {}, None, 60, "the test job")
    msg = str(exc.value)
    assert "the test job failed on host h" in msg and "(exit 1)" in msg and "(failed twice)" in msg
    assert "No module named clustersim.testbed.no_such_job" in msg and "\n" not in msg
