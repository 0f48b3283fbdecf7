import pytest

from clustersim.topologies import GroupShape, build_cluster
from tests.conftest import make_scenario


def cluster(**kw):
    return build_cluster(make_scenario(**kw).cluster)


def test_nvswitch_ring_is_links_times_nccl_link_bandwidth():
    cl = cluster(**{"cluster.gpu": "H100-SXM", "cluster.gpus_per_node": 8})
    assert cl.intra_ring(8).bytes_per_s == pytest.approx(18 * 20.6e9)
    cl = cluster(**{"cluster.gpu": "A100-80GB", "cluster.gpus_per_node": 8})
    assert cl.intra_ring(8).bytes_per_s == pytest.approx(12 * 20e9)  # clusters.md: 228-235 GB/s measured


def test_dgx1_mesh_uses_each_gpus_six_links():
    cl = cluster(
        **{"cluster.gpu": "V100-SXM2", "cluster.gpus_per_node": 8, "cluster.intra_node.fabric": "nvlink_mesh"}
    )
    assert cl.intra_ring(8).bytes_per_s == pytest.approx(6 * 20e9)
    assert cl.intra_ring(2).bytes_per_s == pytest.approx(20e9)  # GPU0-GPU1: one link


def test_pcie_tree_ring_bottleneck_is_a_pcie_link():
    cl = cluster(**{"cluster.gpu": "V100-PCIe", "cluster.intra_node.fabric": "pcie"})
    bw = cl.intra_ring(4)
    assert bw.bytes_per_s == pytest.approx(12e9) and "pcie" in bw.bottleneck


def test_pcie_switch_shared_by_gpus_and_nics_limits_injection():
    # Four 400 Gb/s NICs (48 GB/s each) behind Gen3 switches cannot be fed faster than the switch uplinks.
    cl = cluster(
        **{
            "cluster.gpu": "V100-PCIe",
            "cluster.intra_node.fabric": "pcie",
            "cluster.nic.count": 4,
            "cluster.nic.line_rate_gbps": 400,
        }
    )
    inj = cl.injection()
    assert inj.latency_class == "pcie"
    assert inj.bytes_per_s < 4 * 48e9


def test_tcp_without_rdma_stages_through_host():
    rdma = cluster(
        **{"cluster.nic.count": 4, "cluster.nic.line_rate_gbps": 800, "cluster.nic.gpudirect_rdma": True}
    )
    staged = cluster(
        **{"cluster.nic.count": 4, "cluster.nic.line_rate_gbps": 800, "cluster.nic.gpudirect_rdma": False}
    )
    assert staged.injection().bytes_per_s <= rdma.injection().bytes_per_s


def test_measured_nic_rate_wins():
    cl = cluster(
        **{
            "cluster.nic.kind": "ethernet_tcp",
            "cluster.nic.line_rate_gbps": 40,
            "cluster.nic.effective_gbps": 4.1,
        }
    )
    assert cl.injection().bytes_per_s == pytest.approx(4.1e9 / 8)
    assert cl.injection().measured


def test_oversubscribed_leaf_spine_only_hurts_groups_spanning_leaves():
    kw = {
        "cluster.nodes": 8,
        "cluster.fabric.kind": "leaf_spine",
        "cluster.fabric.nodes_per_leaf": 4,
        "cluster.fabric.oversubscription": 2.0,
    }
    cl = cluster(**kw)
    within = cl.inter_node(GroupShape(4, 4)).bytes_per_s
    across = cl.inter_node(GroupShape(8, 4)).bytes_per_s
    assert across == pytest.approx(within / 2)


def test_rails_share_the_nics():
    cl = cluster(**{"cluster.nodes": 4})
    assert cl.inter_node(GroupShape(4, 1, sharing=4)).bytes_per_s == pytest.approx(
        cl.injection().bytes_per_s / 4
    )


def test_one_gpu_per_node_gets_one_rail_not_every_nic():
    """A communicator of one GPU per node on a DGX H100 (8 x 400G NICs, one per GPU behind its PCIe
    switch) moves data over that GPU's PCIe link to its own NIC: about one NIC's 48 GB/s, never the
    node's 8 NICs (NVLink routes to other GPUs' NICs serve all-to-all, not rings)."""
    from clustersim.scenario import load_scenario

    c = load_scenario("preset:dgx-h100-gpt3-1.3b").cluster
    cl = build_cluster(c)
    nic = cl.injection().bytes_per_s / c.nic.count
    one = cl.inter_node(GroupShape(c.nodes, 1)).bytes_per_s
    assert nic <= one < 1.2 * nic  # its NIC, plus at most what its PCIe link adds through the switch
    assert cl.inter_node(GroupShape(c.nodes, c.gpus_per_node)).bytes_per_s == pytest.approx(c.nic.count * nic)
    assert (
        cl.inter_node(GroupShape(c.nodes, 4)).bytes_per_s < cl.injection().bytes_per_s
    )  # 4 GPUs, fewer NICs


FRONTIER = {
    "cluster.gpu": "MI250X",
    "cluster.gpus_per_node": 8,
    "cluster.intra_node.fabric": "infinity_fabric",
    "cluster.intra_node.gpus_per_pcie_switch": 2,
    "cluster.nic": {"kind": "ethernet_tcp", "count": 4, "line_rate_gbps": 200, "gpudirect_rdma": True},
}


def test_frontier_node_three_levels_of_bandwidth():
    """GCD pair: the package's quad link (200 GB/s); 4 GCDs (two packages): their cut, two single links
    0-2 and 1-3 (100 GB/s); the node: the least cut, a package's four external links 50+100+50+100;
    between nodes: 4 NICs x 200 Gb/s x 0.94 (hardware_defaults nic.ethernet_tcp)."""
    cl = cluster(**FRONTIER, **{"cluster.nodes": 2})
    assert cl.intra_ring(2).bytes_per_s == pytest.approx(200e9)
    assert cl.intra_ring(4).bytes_per_s == pytest.approx(100e9)
    assert cl.intra_ring(8).bytes_per_s == pytest.approx(300e9)
    assert cl.injection().bytes_per_s == pytest.approx(4 * 25e9 * 0.94)
    assert cl.ring(GroupShape(2, 8)).latency_class == "network"
    # one GCD reaches the NICs through its 36 GB/s Infinity Fabric link to the CPU
    assert cl.injection(1).bytes_per_s == pytest.approx(36e9)


def test_infinity_fabric_needs_gcds():
    from clustersim.errors import InputError

    with pytest.raises(InputError, match="MI250X GCDs") as exc:
        cluster(**{**FRONTIER, "cluster.gpu": "A100-80GB"})
    assert exc.value.key == "cluster.intra_node.fabric"
    with pytest.raises(InputError, match="packages of 2 GCDs"):
        cluster(**{**FRONTIER, "cluster.gpus_per_node": 3})
