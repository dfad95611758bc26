"""ResourceSpec: the cluster a model is trained on.

Device names follow AutoDist: `address:GPU:0`, `address:CPU:0`. A node's GPUs are its replicas'
devices; a node without GPUs trains on its CPUs. Bandwidths are in Gbit/s, as network people write
them, and latencies in microseconds; `bytes_per_s` gives what the simulator wants.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

import yaml
from pydantic import Field, model_validator

from stratagem.errors import InvalidResourceSpecError, Problem
from stratagem.ir.catalog import CATALOG, DeviceSpec, lookup
from stratagem.ir.document import Document, Strict, as_value_error
from stratagem.ir.limits import (
    MAX_BANDWIDTH_GBPS,
    MAX_DEVICE_INDEX,
    MAX_DEVICE_KINDS,
    MAX_DEVICES_PER_NODE,
    MAX_LATENCY_US,
    MAX_NODES,
    BoundedJSON,
    Name,
    OptionalName,
    at_most,
)

DeviceIndex = Annotated[int, Field(le=MAX_DEVICE_INDEX)]
"""Negative indices are refused with the reason by `resource_problems`."""

LinkKind = Literal["pcie", "nvlink", "ethernet", "infiniband", "loopback", "shared-memory"]


class Link(Strict):
    kind: LinkKind = "ethernet"
    bandwidth_gbps: Annotated[float, Field(gt=0), at_most(MAX_BANDWIDTH_GBPS)]
    """Line rate per direction in Gbit/s."""
    latency_us: Annotated[float, Field(ge=0), at_most(MAX_LATENCY_US)] = 25.0
    """One step of a collective across this link: for GPUs, a step of NCCL's Simple-protocol ring (NCCL's
    tuning model: 3.4 us over NVLink, 5.7 over PCIe, 14 through a NIC), from which its LL and LL128 steps
    scale (`simulator.collectives`); for CPU ranks, gloo's hop as calibration measures it."""
    efficiency: float = Field(default=0.85, gt=0, le=1)
    """Fraction of the line rate that collectives reach as bus bandwidth at large messages (NCCL: about
    0.8 of NVLink's, 370 of 450 GB/s per direction on H100; 0.98 of an InfiniBand card's data rate,
    12.2 of 12.5 GB/s on EDR: NVIDIA/nccl-tests#212 and #29)."""

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8 * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


NVLINK_STEP_US = 3.4
PCIE_STEP_US = 5.7
"""NCCL's Simple ring step over NVLink and over PCIe (NVIDIA/nccl@5067397c src/graph/tuning.cc, `hwLatencies`)."""
DEFAULT_INTRA_NODE: dict[str, Link] = {
    "T4": Link(kind="pcie", bandwidth_gbps=128, latency_us=PCIE_STEP_US, efficiency=0.8),
    "V100": Link(kind="nvlink", bandwidth_gbps=1200, latency_us=NVLINK_STEP_US, efficiency=0.8),
    "V100-16GB": Link(kind="nvlink", bandwidth_gbps=1200, latency_us=NVLINK_STEP_US, efficiency=0.8),
    "A100-40GB": Link(kind="nvlink", bandwidth_gbps=2400, latency_us=NVLINK_STEP_US, efficiency=0.8),
    "A100-80GB": Link(kind="nvlink", bandwidth_gbps=2400, latency_us=NVLINK_STEP_US, efficiency=0.8),
    "H100": Link(kind="nvlink", bandwidth_gbps=3600, latency_us=NVLINK_STEP_US, efficiency=0.82),
    "H200": Link(kind="nvlink", bandwidth_gbps=3600, latency_us=NVLINK_STEP_US, efficiency=0.82),
    "H100-SXM-96GB-HBM2e": Link(kind="nvlink", bandwidth_gbps=3600, latency_us=NVLINK_STEP_US, efficiency=0.82),
    "CPU": Link(kind="shared-memory", bandwidth_gbps=80, latency_us=20, efficiency=0.8),
}


class Node(Strict):
    address: Name
    chief: bool = False
    gpus: list[DeviceIndex] = Field(default_factory=list, max_length=MAX_DEVICES_PER_NODE)
    cpus: list[DeviceIndex] = Field(default_factory=lambda: [0], max_length=MAX_DEVICES_PER_NODE)
    device: Name = "T4"
    """Device kind of the node's GPUs (catalog name or a key of `devices`); `CPU` for CPU-only nodes."""
    network_bandwidth_gbps: Annotated[float, Field(gt=0), at_most(MAX_BANDWIDTH_GBPS)] | None = None
    """This node's NIC, overriding the spec's `network` bandwidth."""
    ssh_config: OptionalName | None = None

    @property
    def compute_devices(self) -> list[str]:
        if self.gpus:
            return [f"{self.address}:GPU:{i}" for i in self.gpus]
        return [f"{self.address}:CPU:{i}" for i in self.cpus]

    @property
    def all_devices(self) -> list[str]:
        return [f"{self.address}:GPU:{i}" for i in self.gpus] + [f"{self.address}:CPU:{i}" for i in self.cpus]

    @property
    def device_kind(self) -> str:
        return self.device if self.gpus else "CPU"


class ResourceSpec(Document):
    _error_type: ClassVar = InvalidResourceSpecError

    name: OptionalName = "cluster"
    nodes: list[Node] = Field(min_length=1, max_length=MAX_NODES)
    network: Link = Field(default_factory=lambda: Link(kind="ethernet", bandwidth_gbps=10, latency_us=25))
    """The link between nodes (each node's NIC)."""
    intra_node: Link | None = None
    """The link between devices of one node; by default from the device kind (PCIe or NVLink)."""
    devices: dict[Name, DeviceSpec] = Field(default_factory=dict, max_length=MAX_DEVICE_KINDS)
    """Device kinds added to or overriding the built-in catalog."""
    ssh: BoundedJSON | None = None
    """AutoDist's `ssh:` section, kept as given; Stratagem does not need it."""
    provenance: BoundedJSON = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_cluster(self) -> Self:
        as_value_error(resource_problems(self))
        return self

    # --- queries -------------------------------------------------------------------------------

    @property
    def chief(self) -> Node:
        return next((n for n in self.nodes if n.chief), self.nodes[0])

    @property
    def compute_devices(self) -> list[str]:
        """Every device a replica can run on, node by node."""
        return [d for node in self.nodes for d in node.compute_devices]

    @property
    def all_devices(self) -> list[str]:
        return [d for node in self.nodes for d in node.all_devices]

    @property
    def num_devices(self) -> int:
        return len(self.compute_devices)

    def node_of(self, device: str) -> Node:
        address = device_address(device)
        for node in self.nodes:
            if node.address == address:
                return node
        raise KeyError(f"no node with address {address!r} (device {device!r})")

    def device_spec(self, kind: str) -> DeviceSpec:
        if kind in self.devices:
            return self.devices[kind]
        spec = lookup(kind)
        if spec is None:
            raise KeyError(kind)
        return spec

    def node_device_spec(self, node: Node) -> DeviceSpec:
        return self.device_spec(node.device_kind)

    def intra_link(self, node: Node) -> Link:
        if self.intra_node is not None:
            return self.intra_node
        spec = lookup(node.device_kind)
        catalog_name = spec.name if spec is not None else "CPU"
        return DEFAULT_INTRA_NODE.get(catalog_name, DEFAULT_INTRA_NODE["CPU"])

    def nic(self, node: Node) -> Link:
        if node.network_bandwidth_gbps is None:
            return self.network
        return self.network.model_copy(update={"bandwidth_gbps": node.network_bandwidth_gbps})

    # --- AutoDist ------------------------------------------------------------------------------

    @classmethod
    def from_autodist_yaml(cls, text_or_path: str | Path, *, device: str = "T4", name: str = "cluster") -> ResourceSpec:
        """Read AutoDist's resource_spec.yml, which names no GPU kind, hence `device`.

        A one-line string ending in `.yml`/`.yaml` that names an existing file is read as that file: for
        the CLI and scripts, whose user names their own files. Text from anyone else goes to
        `from_autodist_text`, which never touches the filesystem."""
        return cls.from_autodist_text(_read_text_or_path(text_or_path), device=device, name=name)

    @classmethod
    def from_autodist_text(cls, text: str, *, device: str = "T4", name: str = "cluster") -> ResourceSpec:
        """AutoDist's resource_spec.yml given as its text: what the service accepts, never a path."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise InvalidResourceSpecError([Problem("", f"not valid YAML: {_yaml_error(error)}")]) from None
        return cls.parse(autodist_to_dict(data, device=device, name=name))

    def to_autodist_yaml(self) -> str:
        nodes = []
        for node in self.nodes:
            entry: dict[str, Any] = {"address": node.address}
            if node.gpus:
                entry["gpus"] = list(node.gpus)
            entry["cpus"] = list(node.cpus)
            if node.chief:
                entry["chief"] = True
            if node.ssh_config:
                entry["ssh_config"] = node.ssh_config
            entry["network_bandwidth"] = node.network_bandwidth_gbps or self.network.bandwidth_gbps
            nodes.append(entry)
        data: dict[str, Any] = {"nodes": nodes}
        if self.ssh:
            data["ssh"] = self.ssh
        return yaml.safe_dump(data, sort_keys=False)


def _read_text_or_path(text_or_path: str | Path) -> str:
    if isinstance(text_or_path, Path):
        return text_or_path.read_text()
    if "\n" not in text_or_path and text_or_path.endswith((".yml", ".yaml")) and Path(text_or_path).exists():
        return Path(text_or_path).read_text()
    return text_or_path


AUTODIST_NODE_KEYS = {"address", "gpus", "cpus", "chief", "ssh_config", "network_bandwidth"}


def autodist_to_dict(data: Any, *, device: str, name: str) -> dict[str, Any]:
    """Map AutoDist's keys onto ours, refusing anything AutoDist itself would not accept."""
    if not isinstance(data, dict) or "nodes" not in data:
        raise InvalidResourceSpecError([Problem("nodes", "an AutoDist resource spec needs a 'nodes' list")])
    unknown = set(data) - {"nodes", "ssh"}
    if unknown:
        raise InvalidResourceSpecError(
            [Problem(k, "unknown key in an AutoDist resource spec") for k in sorted(unknown)]
        )
    if not isinstance(data["nodes"], list):
        raise InvalidResourceSpecError([Problem("nodes", "must be a list")])
    nodes, bandwidths, problems = [], [], []
    for i, raw in enumerate(data["nodes"]):
        if not isinstance(raw, dict):
            problems.append(Problem(f"nodes[{i}]", "must be a mapping"))
            continue
        for key in sorted(set(raw) - AUTODIST_NODE_KEYS):
            problems.append(Problem(f"nodes[{i}].{key}", "unknown key in an AutoDist node"))
        node = {k: raw[k] for k in ("address", "gpus", "chief", "ssh_config") if k in raw}
        node["cpus"] = raw.get("cpus", [0])
        node["device"] = device if raw.get("gpus") else "CPU"
        if "network_bandwidth" in raw:
            bandwidth = raw["network_bandwidth"]
            if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or bandwidth <= 0:
                problems.append(
                    Problem(f"nodes[{i}].network_bandwidth", f"must be a positive number of Gbit/s, got {bandwidth!r}")
                )
            node["network_bandwidth_gbps"] = bandwidth
            bandwidths.append(raw["network_bandwidth"])
        nodes.append(node)
    if problems:
        raise InvalidResourceSpecError(problems)
    numeric = [b for b in bandwidths if isinstance(b, (int, float)) and b > 0]
    network = {"kind": "ethernet", "bandwidth_gbps": min(numeric) if numeric else 10, "latency_us": 25}
    spec: dict[str, Any] = {"name": name, "nodes": nodes, "network": network}
    if data.get("ssh") is not None:
        spec["ssh"] = data["ssh"]
    return spec


def device_address(device: str) -> str:
    return device.rsplit(":", 2)[0]


def parse_device(device: str) -> tuple[str, str, int]:
    """`10.0.0.1:GPU:3` -> (`10.0.0.1`, `GPU`, 3); raises ValueError on anything else."""
    parts = device.rsplit(":", 2)
    if len(parts) != 3 or parts[1] not in ("GPU", "CPU") or not parts[2].isdigit():
        raise ValueError(f"{device!r} is not a device name like 'address:GPU:0' or 'address:CPU:0'")
    return parts[0], parts[1], int(parts[2])


def _is_loopback(address: str) -> bool:
    if address in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def resource_problems(spec: ResourceSpec) -> list[Problem]:
    problems: list[Problem] = []
    chiefs = [i for i, node in enumerate(spec.nodes) if node.chief]
    if len(spec.nodes) > 1 and not chiefs:
        problems.append(Problem("nodes", f"{len(spec.nodes)} nodes and no chief; mark exactly one node 'chief: true'"))
    if len(chiefs) > 1:
        problems.append(Problem("nodes", f"{len(chiefs)} chiefs (nodes {chiefs}); exactly one node may be chief"))
    addresses: dict[str, int] = {}
    for i, node in enumerate(spec.nodes):
        if node.address in addresses:
            problems.append(
                Problem(
                    f"nodes[{i}].address", f"duplicate address {node.address!r} (also nodes[{addresses[node.address]}])"
                )
            )
        addresses.setdefault(node.address, i)
        if len(spec.nodes) > 1 and _is_loopback(node.address):
            problems.append(
                Problem(
                    f"nodes[{i}].address",
                    f"loopback address {node.address!r} in a cluster of {len(spec.nodes)} nodes; other nodes could not reach it",
                )
            )
        if not node.gpus and not node.cpus:
            problems.append(Problem(f"nodes[{i}]", "has no devices: list its gpus or cpus"))
        for field, ids in (("gpus", node.gpus), ("cpus", node.cpus)):
            if len(set(ids)) != len(ids):
                problems.append(Problem(f"nodes[{i}].{field}", "duplicate device index"))
            if any(d < 0 for d in ids):
                problems.append(Problem(f"nodes[{i}].{field}", "device indices must be non-negative"))
        if node.gpus and node.device not in spec.devices and lookup(node.device) is None:
            known = sorted(set(CATALOG) | set(spec.devices))
            problems.append(
                Problem(f"nodes[{i}].device", f"unknown device kind {node.device!r}; known: {', '.join(known)}")
            )
    return problems


def _yaml_error(error: yaml.YAMLError) -> str:
    """PyYAML's message on one line, with 1-based positions: its own spans several and quotes the text."""
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return " ".join(str(error).split())
    mark = error.problem_mark
    text = f"line {mark.line + 1}, column {mark.column + 1}: {error.problem}"
    if error.context and error.context_mark is not None:
        text += f" ({error.context} at line {error.context_mark.line + 1}, column {error.context_mark.column + 1})"
    return text
