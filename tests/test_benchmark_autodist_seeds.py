"""AutoDist's own benchmark as the simulator ranks it: what decides each model's best strategy is priced
(parameter-server incast and load imbalance through one 50 Gbit/s NIC, ring all-reduce over PCIe and
the thin network, sparse rows under Parallax), and the ranking says so."""

from __future__ import annotations

import pytest

from benchmarks import autodist_seeds


@pytest.fixture(scope="module")
def priced() -> dict:
    return autodist_seeds.run(["vgg16", "bert_large"], [1, 8, 16])


def test_the_cluster_is_autodists_own_resource_spec_of_g4dn_nodes() -> None:
    spec = autodist_seeds.cluster(4)
    assert len(spec.nodes) == 4 and all(node.gpus == [0, 1, 2, 3] for node in spec.nodes)
    assert spec.chief.address == "10.0.0.1" and spec.device_spec("T4").name == "T4"
    assert spec.nic(spec.nodes[0]).bandwidth_gbps == 50


def test_vgg16s_dense_parameters_make_every_parameter_server_lose_to_the_ring_at_sixteen_nodes(priced) -> None:
    vgg = priced["vgg16"]
    assert vgg["parameters"] == pytest.approx(138.36e6, rel=0.01) and not vgg["sparse_variables"]
    sixteen = vgg["nodes"]["16"]
    assert set(sixteen["ranking"][0]) == {"AllReduce", "Parallax"}
    assert sixteen["ranking"][-1] == ["PS"]
    throughput = sixteen["per_gpu_samples_per_s"]
    assert throughput["PS"] < 0.25 * throughput["AllReduce"]
    assert sixteen["exposed_s"]["PS"]["ps"] > 2 * sixteen["exposed_s"]["PS"]["compute"]
    assert "incast" in vgg["rationale"]


def test_vgg16s_one_huge_layer_unbalances_load_balancing_and_partitioning_repairs_it(priced) -> None:
    sixteen = priced["vgg16"]["nodes"]["16"]
    assert sixteen["busiest_server_share"]["PSLoadBalancing"] > 0.7
    assert sixteen["busiest_server_share"]["PartitionedPS"] < 0.5
    assert sixteen["per_gpu_samples_per_s"]["PartitionedPS"] > sixteen["per_gpu_samples_per_s"]["PSLoadBalancing"]
    assert "classifier.0.weight" in priced["vgg16"]["rationale"]


def test_parallax_wins_on_berts_sparse_embedding_once_the_network_carries_it(priced) -> None:
    bert = priced["bert_large"]
    assert bert["sparse_variables"] == ["embed.weight"]
    for nodes in ("8", "16"):
        figures = bert["nodes"][nodes]
        assert figures["ranking"][0] == ["Parallax"], figures
        assert figures["per_gpu_samples_per_s"]["Parallax"] > 1.02 * figures["per_gpu_samples_per_s"]["AllReduce"]
    assert "sparse gradients" in bert["rationale"]


def test_one_node_is_a_tie_between_the_all_reduce_strategies_and_between_the_servers(priced) -> None:
    one = priced["vgg16"]["nodes"]["1"]
    assert [set(group) for group in one["ranking"]] == [
        {"AllReduce", "Parallax"},
        {"PS", "PartitionedPS", "PSLoadBalancing"},
    ]


def test_the_ranking_is_stable_from_eight_to_sixteen_nodes(priced) -> None:
    for model in ("vgg16", "bert_large"):
        eight, sixteen = priced[model]["nodes"]["8"], priced[model]["nodes"]["16"]
        assert eight["ranking"][0] == sixteen["ranking"][0]
        assert eight["ranking"][-1] == sixteen["ranking"][-1] == ["PS"]
