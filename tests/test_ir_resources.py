"""ResourceSpec's rules, the device catalog, and AutoDist resource_spec.yml import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from stratagem.errors import InvalidResourceSpecError
from stratagem.ir import CATALOG, DeviceSpec, Node, ResourceSpec, device_address, parse_device
from stratagem.ir.document import content_hash

AUTODIST_YAML = """\
nodes:
  - address: 172.31.30.187
    cpus: [0]
    gpus: [0, 1, 2, 3]
    chief: true
    network_bandwidth: 50
  - address: 172.31.18.140
    gpus: [0, 1, 2, 3]
    ssh_config: conf
    network_bandwidth: 25
ssh:
  conf:
    username: 'root'
    key_file: '/root/.ssh/id_rsa'
    python_venv: 'source /root/venvs/autodist/bin/activate'
    shared_envs:
      LD_LIBRARY_PATH: '$LD_LIBRARY_PATH:/usr/local/cuda/lib64'
"""


def spec_dict(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "pair",
        "nodes": [
            {"address": "10.0.0.1", "chief": True, "gpus": [0, 1], "device": "V100"},
            {"address": "10.0.0.2", "gpus": [0, 1], "device": "V100", "network_bandwidth_gbps": 25},
        ],
        "network": {"kind": "ethernet", "bandwidth_gbps": 100, "latency_us": 10},
    }
    data.update(overrides)
    return data


def error_text(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidResourceSpecError) as caught:
        ResourceSpec.parse(data)
    return str(caught.value)


def yaml_error(text: str) -> str:
    with pytest.raises(InvalidResourceSpecError) as caught:
        ResourceSpec.from_autodist_yaml(text)
    return str(caught.value)


def test_autodist_yaml_imports_as_is() -> None:
    spec = ResourceSpec.from_autodist_yaml(AUTODIST_YAML, device="T4")
    assert [n.address for n in spec.nodes] == ["172.31.30.187", "172.31.18.140"]
    assert spec.chief.address == "172.31.30.187"
    assert spec.compute_devices[:2] == ["172.31.30.187:GPU:0", "172.31.30.187:GPU:1"]
    assert spec.num_devices == 8
    assert spec.nodes[1].ssh_config == "conf" and spec.nodes[1].cpus == [0]
    assert spec.nodes[0].network_bandwidth_gbps == 50 and spec.nodes[1].network_bandwidth_gbps == 25
    assert spec.network.bandwidth_gbps == 25  # the slowest NIC bounds the cluster's network
    assert spec.nic(spec.nodes[0]).bandwidth_gbps == 50
    assert spec.ssh == yaml.safe_load(AUTODIST_YAML)["ssh"]
    assert spec.node_device_spec(spec.nodes[0]).name == "T4"


def test_autodist_yaml_reads_from_a_path_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "resource_spec.yml"
    path.write_text(AUTODIST_YAML)
    from_path = ResourceSpec.from_autodist_yaml(str(path))
    assert from_path == ResourceSpec.from_autodist_yaml(path) == ResourceSpec.from_autodist_yaml(AUTODIST_YAML)
    again = ResourceSpec.from_autodist_yaml(from_path.to_autodist_yaml())
    assert again.nodes == from_path.nodes and again.ssh == from_path.ssh


def test_a_single_autodist_node_needs_no_chief_and_may_be_loopback() -> None:
    spec = ResourceSpec.from_autodist_yaml("nodes:\n  - address: localhost\n    cpus: [0, 1]\n")
    assert spec.compute_devices == ["localhost:CPU:0", "localhost:CPU:1"]
    assert spec.chief.address == "localhost"
    assert spec.node_device_spec(spec.nodes[0]).is_gpu is False


def test_several_nodes_need_exactly_one_chief() -> None:
    no_chief = AUTODIST_YAML.replace("    chief: true\n", "")
    assert "nodes: 2 nodes and no chief" in yaml_error(no_chief)
    two_chiefs = AUTODIST_YAML.replace("    ssh_config: conf\n", "    chief: true\n")
    assert "nodes: 2 chiefs (nodes [0, 1]); exactly one node may be chief" in yaml_error(two_chiefs)


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost", "::1"])
def test_loopback_addresses_are_refused_in_a_multi_node_cluster(address: str) -> None:
    data = spec_dict()
    data["nodes"][1]["address"] = address
    assert f"nodes[1].address: loopback address {address!r} in a cluster of 2 nodes" in error_text(data)


def test_a_node_needs_devices() -> None:
    data = spec_dict()
    data["nodes"][1].update(gpus=[], cpus=[])
    assert "nodes[1]: has no devices" in error_text(data)


def test_bandwidth_must_be_positive_in_both_formats() -> None:
    assert "nodes[1].network_bandwidth: must be a positive number of Gbit/s, got 0" in yaml_error(
        AUTODIST_YAML.replace("network_bandwidth: 25", "network_bandwidth: 0")
    )
    assert "nodes[0].network_bandwidth: must be a positive number of Gbit/s, got 'fast'" in yaml_error(
        AUTODIST_YAML.replace("network_bandwidth: 50", "network_bandwidth: fast")
    )
    assert "network.bandwidth_gbps: Input should be greater than 0" in error_text(
        spec_dict(network={"bandwidth_gbps": -5})
    )
    data = spec_dict()
    data["nodes"][1]["network_bandwidth_gbps"] = 0
    assert "nodes[1].network_bandwidth_gbps: Input should be greater than 0" in error_text(data)


def test_duplicate_addresses_and_device_indices_are_refused() -> None:
    data = spec_dict()
    data["nodes"][1]["address"] = "10.0.0.1"
    assert "nodes[1].address: duplicate address '10.0.0.1' (also nodes[0])" in error_text(data)
    data = spec_dict()
    data["nodes"][0]["gpus"] = [0, 0]
    assert "nodes[0].gpus: duplicate device index" in error_text(data)
    data["nodes"][0]["gpus"] = [-1]
    assert "nodes[0].gpus: device indices must be non-negative" in error_text(data)


def test_an_unknown_device_kind_is_refused_listing_the_known_ones() -> None:
    data = spec_dict()
    data["nodes"][0]["device"] = "TPUv4"
    text = error_text(data)
    assert "nodes[0].device: unknown device kind 'TPUv4'; known: A100-40GB" in text
    assert "H100" in text and "T4" in text


def test_device_kinds_can_be_added_and_catalog_figures_overridden() -> None:
    t4 = CATALOG["T4"].model_dump()
    slow_t4 = {**t4, "memory_bytes": 15e9, "matmul_efficiency": 0.4}
    custom = {**t4, "name": "MI250", "peak_flops": {"float32": 45e12}}
    data = spec_dict(devices={"T4": slow_t4, "MI250": custom})
    data["nodes"][0]["device"] = "T4"
    data["nodes"][1]["device"] = "MI250"
    spec = ResourceSpec.parse(data)
    assert spec.node_device_spec(spec.nodes[0]).memory_bytes == 15e9
    assert spec.device_spec("T4").matmul_efficiency == 0.4
    assert spec.node_device_spec(spec.nodes[1]).flops_for("float16") == 45e12  # falls back to fp32 peak
    assert CATALOG["T4"].memory_bytes == 16e9  # the built-in catalog is untouched


def test_catalog_aliases_and_figures_match_the_data_sheets() -> None:
    spec = ResourceSpec.parse(spec_dict())
    assert spec.device_spec("A100").name == "A100-40GB"
    assert CATALOG["T4"].peak_flops["float32"] == 8.1e12 and CATALOG["T4"].memory_bandwidth == 320e9
    assert CATALOG["H100"].flops_for("bfloat16") == 989e12
    with pytest.raises(KeyError):
        spec.device_spec("Z80")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(region="us-east"), "region: Extra inputs are not permitted"),
        (lambda d: d["nodes"][0].update(rack=3), "nodes[0].rack: Extra inputs are not permitted"),
        (lambda d: d["network"].update(mtu=9000), "network.mtu: Extra inputs are not permitted"),
        (lambda d: d.update(devices={"X": {**CATALOG["T4"].model_dump(), "tdp": 70}}), "devices.X.tdp: Extra inputs"),
    ],
    ids=["top-level", "node", "network", "device"],
)
def test_unknown_fields_are_rejected_at_every_level(mutate: Any, expected: str) -> None:
    data = spec_dict()
    mutate(data)
    assert expected in error_text(data)


def test_autodist_yaml_with_unknown_keys_or_bad_shape_is_refused() -> None:
    assert "nodes[0].gpu_count: unknown key in an AutoDist node" in yaml_error(
        AUTODIST_YAML.replace("    cpus: [0]\n", "    gpu_count: 4\n")
    )
    assert "cluster: unknown key in an AutoDist resource spec" in yaml_error(AUTODIST_YAML + "cluster: aws\n")
    assert "nodes: an AutoDist resource spec needs a 'nodes' list" in yaml_error("ssh: {}\n")
    assert "nodes: must be a list" in yaml_error("nodes: 3\n")
    assert "nodes[0]: must be a mapping" in yaml_error("nodes:\n  - 10.0.0.1\n")
    assert "not valid YAML" in yaml_error("nodes: [\n")
    located = yaml_error("nodes:\n  - address: 10.0.0.1\n    gpus: [0, 1\n")
    assert "line 4, column 1: expected ',' or ']'" in located and "at line 3, column 11" in located
    assert "\n" not in located


def test_content_id_is_stable_and_covers_the_cluster() -> None:
    spec = ResourceSpec.parse(spec_dict())
    assert ResourceSpec.parse(spec.to_json()).id == spec.id
    assert ResourceSpec.parse(spec_dict(provenance={"from": "test"})).id == spec.id
    assert ResourceSpec.parse(spec_dict(network={"bandwidth_gbps": 10})).id != spec.id
    assert "does not match the content" in error_text(spec_dict(id="1" * 64))


def test_links_and_devices_are_derived_from_the_nodes() -> None:
    spec = ResourceSpec.parse(spec_dict())
    node = spec.nodes[0]
    assert spec.intra_link(node).kind == "nvlink"  # V100's default
    assert spec.nic(spec.nodes[1]).bandwidth_gbps == 25 and spec.nic(node).bandwidth_gbps == 100
    assert spec.network.bytes_per_s == pytest.approx(100e9 / 8 * 0.85)
    assert spec.network.latency_s == pytest.approx(10e-6)
    assert node.all_devices == ["10.0.0.1:GPU:0", "10.0.0.1:GPU:1", "10.0.0.1:CPU:0"]
    assert spec.node_of("10.0.0.2:GPU:1").address == "10.0.0.2"
    with pytest.raises(KeyError, match="no node with address"):
        spec.node_of("10.9.9.9:GPU:0")


def test_device_names_parse_in_autodist_form() -> None:
    assert parse_device("10.0.0.1:GPU:3") == ("10.0.0.1", "GPU", 3)
    assert parse_device("fe80::1:CPU:0") == ("fe80::1", "CPU", 0)
    assert device_address("host-a:CPU:1") == "host-a"
    for bad in ("10.0.0.1:TPU:0", "10.0.0.1:GPU", "GPU:x"):
        with pytest.raises(ValueError, match="is not a device name"):
            parse_device(bad)


def test_shared_fixture_clusters_are_valid(cpu_1x2: ResourceSpec, t4_2x4: ResourceSpec, t4_16x4: ResourceSpec) -> None:
    assert cpu_1x2.compute_devices == ["127.0.0.1:CPU:0", "127.0.0.1:CPU:1"]
    assert t4_2x4.num_devices == 8 and t4_2x4.network.bandwidth_gbps == 50
    assert t4_2x4.intra_link(t4_2x4.nodes[0]).kind == "pcie"
    assert t4_16x4.num_devices == 64 and t4_16x4.chief.address == "10.0.0.1"


def test_non_finite_figures_are_refused_naming_the_field() -> None:
    custom = {**CATALOG["T4"].model_dump(), "name": "X", "peak_flops": {"float32": float("nan")}}
    assert "devices.X.peak_flops.float32: must be a finite number" in error_text(spec_dict(devices={"X": custom}))
    assert "network.bandwidth_gbps: must be a finite number" in error_text(
        spec_dict(network={"bandwidth_gbps": float("inf")})
    )


def test_fields_at_their_default_are_left_out_of_the_id_at_every_depth():
    base = ResourceSpec(
        nodes=[Node(address="a", chief=True, gpus=[0], device="X")],
        devices={"X": DeviceSpec(name="X", peak_flops={"float32": 1e12}, memory_bytes=1e9, memory_bandwidth=1e11)},
    )
    content = base.model_dump(mode="json", exclude={"id", "provenance"}, exclude_defaults=True)
    assert "full_select_efficiency" not in content["devices"]["X"] and "network" not in content
    assert base.id == content_hash(content)
    explicit = base.replace(
        devices={"X": base.devices["X"].model_copy(update={"full_select_efficiency": None}).model_dump()}
    )
    assert explicit.id == base.id  # a field written at its default is the same document
    changed = base.replace(
        devices={"X": base.devices["X"].model_copy(update={"full_select_efficiency": 0.5}).model_dump()}
    )
    assert changed.id != base.id
    with pytest.raises(InvalidResourceSpecError, match="does not match the content"):
        ResourceSpec.parse({**json.loads(base.to_json()), "name": "edited"})
