"""The simpy engine's semantics on programs whose answer is known by hand."""

import pytest

from clustersim.simulator.engine import Engine
from clustersim.simulator.program import Program
from clustersim.simulator.result import attribute_timeline


def run(prog):
    start, end = Engine(prog).run()
    return start, end, attribute_timeline(prog, start, end)


def test_stream_runs_in_order_and_serially():
    p = Program()
    a = p.add("a", "compute", 1.0, "forward")
    b = p.add("b", "compute", 2.0, "backward")
    start, end, (total, parts) = run(p)
    assert (start[a], end[a], start[b], end[b]) == (0, 1, 1, 3)
    assert total == 3 and parts["forward"] == 1 and parts["backward"] == 2


def test_streams_overlap_and_dependencies_hold():
    p = Program()
    a = p.add("bwd", "compute", 3.0, "backward")
    c = p.add("comm", "comm", 2.0, "communication")  # no deps: overlaps with bwd
    d = p.add("comm2", "comm", 2.0, "communication", deps=(a,))
    start, end, (total, parts) = run(p)
    assert end[c] == pytest.approx(2.0)
    assert start[d] == pytest.approx(3.0) and total == pytest.approx(5.0)
    assert parts["exposed_communication"] == pytest.approx(2.0)
    assert sum(parts.values()) == pytest.approx(total)


def test_nccl_kernel_slows_concurrent_compute():
    p = Program()
    a = p.add("compute", "compute", 1.0, "backward")
    p.add("comm", "comm", 0.5, "communication", compute_slowdown=0.5)
    start, end, _ = run(p)
    # During the first 0.5 s compute runs at half speed (0.25 s of work), then 0.75 s alone.
    assert end[a] == pytest.approx(1.25)


def test_flows_on_a_link_share_it_fairly():
    p = Program(links={"pcie0": 10.0})
    x = p.add("x", "d2h", 1.0, "transfer", demands={"pcie0": 10.0})
    y = p.add("y", "h2d", 3.0, "transfer", demands={"pcie0": 10.0})
    start, end, _ = run(p)
    assert end[x] == pytest.approx(2.0)  # both at half rate for 2 s
    assert end[y] == pytest.approx(4.0)  # then y alone: 3 - 1 = 2 s of work left at full rate


def test_max_min_fairness_gives_the_small_flow_its_full_rate():
    p = Program(links={"link": 10.0})
    small = p.add("nic-bound collective", "comm", 1.0, "communication", demands={"link": 2.0})
    big = p.add("copy", "d2h", 1.0, "transfer", demands={"link": 10.0})
    start, end, _ = run(p)
    # fair share is 5 each; the small flow only wants 2, so it runs at full speed and the copy gets 8.
    assert end[small] == pytest.approx(1.0)
    assert end[big] == pytest.approx(1.2)  # 0.8 of its work in the first second, the rest alone


def test_bytes_through_a_link_never_exceed_its_capacity():
    p = Program(links={"a": 4.0, "b": 6.0})
    ops = [
        p.add(f"f{i}", stream, 1.0, "transfer", demands=d)
        for i, (stream, d) in enumerate(
            zip(("copy", "d2h", "h2d"), [{"a": 4.0}, {"a": 4.0, "b": 6.0}, {"b": 6.0}])
        )
    ]
    start, end, _ = run(p)
    # Equal bandwidth on each flow's heaviest link: a saturates at 2.4 B/s each for f0 and f1
    # (rates 0.6 and 0.4, f1 then holding 2.4 of b), f2 takes the 3.6 left on b (rate 0.6).
    assert end[ops[0]] == pytest.approx(1 / 0.6) and end[ops[2]] == pytest.approx(1 / 0.6)
    assert end[ops[1]] == pytest.approx(1 / 0.6 + (1 - 0.4 / 0.6))


def test_zero_duration_ops_and_long_chains():
    p = Program()
    prev = None
    for i in range(500):
        prev = p.add(
            f"op{i}",
            "compute" if i % 2 else "comm",
            0.0 if i % 7 == 0 else 0.001,
            "forward" if i % 2 else "communication",
            deps=(prev,) if prev is not None else (),
        )
    start, end, (total, _) = run(p)
    assert total == pytest.approx(sum(0.001 for i in range(500) if i % 7))


def test_deadlock_is_reported():
    p = Program()
    p.add("a", "compute", 1.0, "forward", deps=(1,))
    p.add("b", "comm", 1.0, "forward", deps=(0,))
    with pytest.raises(RuntimeError, match="deadlock"):
        Engine(p).run()


def test_an_unknown_stream_or_category_is_an_error_where_it_is_made():
    p = Program()
    with pytest.raises(ValueError, match="unknown stream 'compte'"):
        p.add("a", "compte", 1.0, "forward")
    with pytest.raises(ValueError, match="unknown op category"):
        p.add("a", "compute", 1.0, "fwd")


def test_contention_free_end_is_a_lower_bound():
    from clustersim.simulator.engine import contention_free_end

    p = Program(links={"pcie0": 10.0})
    a = p.add("compute", "compute", 1.0, "backward")
    p.add("comm", "comm", 0.5, "communication", compute_slowdown=0.5)
    x = p.add("x", "d2h", 1.0, "transfer", (a,), demands={"pcie0": 10.0})
    p.add("y", "h2d", 3.0, "transfer", demands={"pcie0": 10.0})
    p.add("z", "compute", 0.5, "optimizer", (x,))
    _, end, _ = run(p)
    assert contention_free_end(p) == pytest.approx(3.0)  # y alone; the compute chain is 2.5
    assert contention_free_end(p) <= max(end.values())
    assert max(end.values()) > 3.0  # the copies shared the link


def test_one_pass_gives_up_where_a_later_kernel_slows_an_earlier_compute_op():
    """engine_inorder evaluates in program order; a NCCL kernel added after a compute op it overlaps
    would have slowed it, so the pass returns None and the event engine answers (same closed form as
    test_nccl_kernel_slows_concurrent_compute, on a pipeline-stage rank)."""
    from clustersim.simulator.engine_inorder import run_in_order

    p = Program()
    p.add("stage 0", "compute", 0.1, "forward")
    a = p.add("compute", "compute", 1.0, "backward", rank=1)
    p.add("comm", "comm", 0.5, "communication", compute_slowdown=0.5, rank=1)
    assert run_in_order(p) is None
    _, end = Engine(p).run()
    assert end[a] == pytest.approx(1.25)


def test_one_pass_integrates_earlier_kernels_over_a_compute_op():
    """Kernels added before the compute op: 0.5 s at half speed under the first, 0.2 s more at 0.7 of
    full speed under the second (slowdown 0.3, starting at 0.5, ending at 0.9), then full speed:
    0.25 + 0.28 = 0.53 s of work by 0.9 s, the remaining 0.47 s by 1.37 s."""
    from clustersim.simulator.engine_inorder import run_in_order

    p = Program()
    k1 = p.add("kernel 1", "comm", 0.5, "communication", compute_slowdown=0.5, rank=1)
    p.add("kernel 2", "comm", 0.4, "communication", (k1,), compute_slowdown=0.3, rank=1)
    a = p.add("compute", "compute", 1.0, "backward", rank=1)
    start, end = run_in_order(p)
    assert end[a] == pytest.approx(1.37)
    general = Engine(p, ranked=False).run()
    assert end == pytest.approx(general[1]) and start == pytest.approx(general[0])


def test_one_pass_equals_the_event_engines_on_random_programs():
    """Random programs of one or several ranks (dependencies on earlier ops and on other ranks' ops,
    kernels that slow compute, zero-length ops, copies and collectives pushing bytes through two links,
    sometimes more than a link carries): every path of the engine gives the same start and end for
    every op, whether the one pass applies or gives up."""
    import random

    from clustersim.simulator.engine_inorder import run_in_order

    rng = random.Random(12)
    applied = gave_up = 0
    for _ in range(300):
        p = Program(links={"pcie": 10.0, "nic": 4.0})
        for i in range(rng.randint(5, 40)):
            stream = rng.choice(["compute", "compute", "comm", "d2h"])
            deps = tuple(rng.sample(range(i), k=min(i, rng.randint(0, 2))))
            # Link demands on some copies and collectives: sometimes within capacity when alone
            # (contention only where they overlap), sometimes over it (a slowed flow).
            link = rng.choice(["pcie", "nic"])
            demands = (
                {link: rng.choice([1.0, 3.0, 6.0, 12.0])}
                if stream != "compute" and rng.random() < 0.5
                else {}
            )
            p.add(
                f"op{i}",
                stream,
                rng.choice([0.0, rng.uniform(0.01, 1.0), rng.uniform(0.01, 1.0)]),
                "forward" if stream == "compute" else "communication",
                deps,
                compute_slowdown=rng.choice([0.0, 0.2, 0.5]) if stream == "comm" else 0.0,
                rank=rng.randint(0, 2) if rng.random() < 0.5 else 0,
                demands=demands,
            )
        one_pass = run_in_order(p)
        applied, gave_up = applied + (one_pass is not None), gave_up + (one_pass is None)
        general = Engine(p, ranked=False).run()
        for start, end in (Engine(p).run(), Engine(p, in_order=False).run()):
            for i in general[1]:
                assert start[i] == pytest.approx(general[0][i], rel=1e-9, abs=1e-12)
                assert end[i] == pytest.approx(general[1][i], rel=1e-9, abs=1e-12)
    assert applied > 40 and gave_up > 40  # both branches were exercised


def test_one_pass_gives_up_where_a_later_op_shares_a_link_with_an_earlier_one():
    """Link loads in program order: y (after a 2 s compute op) drops x's finished interval from the
    PCIe link; z, added after y but starting at 0, would share the link with x (6 + 6 > 10 bytes/s).
    The pass cannot see x any more, so it gives up and max-min sharing answers: x and z at 5/6 of
    their rate while both run, 1.2 s each."""
    from clustersim.simulator.engine_inorder import run_in_order

    p = Program(links={"pcie": 10.0})
    w = p.add("w", "compute", 2.0, "forward")
    x = p.add("x", "d2h", 1.0, "transfer", demands={"pcie": 6.0})
    p.add("y", "h2d", 1.0, "transfer", (w,), demands={"pcie": 6.0})
    z = p.add("z", "comm", 1.0, "communication", demands={"pcie": 6.0})
    assert run_in_order(p) is None
    _, end = Engine(p).run()
    assert end[x] == pytest.approx(1.2) and end[z] == pytest.approx(1.2)


def test_one_pass_takes_programs_whose_links_are_never_over_capacity():
    """Two copies that together stay within the link run at full rate: the one pass places them."""
    from clustersim.simulator.engine_inorder import run_in_order

    p = Program(links={"pcie": 10.0})
    x = p.add("x", "d2h", 1.0, "transfer", demands={"pcie": 6.0})
    y = p.add("y", "h2d", 2.0, "transfer", demands={"pcie": 4.0})
    start, end = run_in_order(p)
    assert (end[x], end[y]) == (1.0, 2.0)
    assert (start, end) == Engine(p, ranked=False).run()
