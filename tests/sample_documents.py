"""Small hand-built graphs and clusters every part of the test suite can reuse, at any size.

FLOPs and bytes are worked out from the shapes at the stated batch size, so simulator tests can
reason about them. `conftest.py` offers the default sizes as fixtures (`mlp_graph`, `t4_2x4`, ...).
"""

from __future__ import annotations

import itertools

from stratagem.ir import DeviceSpec, Layer, Link, ModelGraph, Node, ResourceSpec, Variable

FLOAT32 = 4


def _linear(
    name: str, batch: int, fan_in: int, fan_out: int, inputs: list[str], itemsize: int = FLOAT32
) -> tuple[Layer, list[Variable]]:
    """A Linear layer's cost: 2·B·in·out forward FLOPs, twice that backward (input and weight grads)."""
    flops = 2.0 * batch * fan_in * fan_out
    weight = Variable(name=f"{name}.weight", shape=[fan_out, fan_in], consumer=name)
    bias = Variable(name=f"{name}.bias", shape=[fan_out], consumer=name)
    layer = Layer(
        name=name,
        type="Linear",
        kind="matmul",
        fwd_flops=flops,
        bwd_flops=2 * flops,
        bytes_moved=float((batch * fan_in + fan_in * fan_out + fan_out + batch * fan_out) * itemsize),
        activation_bytes=float(batch * fan_in * itemsize),
        output_bytes=float(batch * fan_out * itemsize),
        inputs=inputs,
        variables=[weight.name, bias.name],
    )
    return layer, [weight, bias]


def _relu(name: str, batch: int, width: int, source: str) -> Layer:
    nbytes = float(batch * width * FLOAT32)
    return Layer(
        name=name,
        type="ReLU",
        kind="elementwise",
        fwd_flops=batch * width,
        bwd_flops=batch * width,
        bytes_moved=2 * nbytes,
        activation_bytes=nbytes,
        output_bytes=nbytes,
        inputs=[source],
    )


def make_mlp_graph(
    batch_size: int = 32, widths: tuple[int, ...] = (784, 512, 256, 10), name: str = "mlp"
) -> ModelGraph:
    """Linear/ReLU stack; `widths` are the feature sizes between layers."""
    layers: list[Layer] = []
    variables: list[Variable] = []
    previous: list[str] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        layer, params = _linear(f"fc{i + 1}", batch_size, fan_in, fan_out, previous)
        layers.append(layer)
        variables.extend(params)
        previous = [layer.name]
        if i < len(widths) - 2:
            relu = _relu(f"act{i + 1}", batch_size, fan_out, layer.name)
            layers.append(relu)
            previous = [relu.name]
    return ModelGraph(
        name=name, batch_size=batch_size, layers=layers, variables=variables, provenance={"source": "tests/conftest.py"}
    )


def make_embedding_graph(batch_size: int = 64, rows: int = 100_000, dim: int = 64, fields: int = 8) -> ModelGraph:
    """Embedding table (sparse gradients) looked up `fields` times per sample, then a dense MLP."""
    lookups = batch_size * fields
    emb_out = float(lookups * dim * FLOAT32)
    embedding = Layer(
        name="embedding",
        type="Embedding",
        kind="embedding",
        fwd_flops=0.0,
        bwd_flops=float(lookups * dim),
        bytes_moved=2 * emb_out,
        activation_bytes=float(lookups * 8),
        output_bytes=emb_out,
        variables=["embedding.weight", "position.weight"],
    )
    table = Variable(
        name="embedding.weight", shape=[rows, dim], sparse=True, lookups_per_step=lookups, consumer="embedding"
    )
    position = Variable(name="position.weight", shape=[fields, dim], trainable=False, consumer="embedding")
    layers = [embedding]
    variables = [table, position]
    fc1, fc1_vars = _linear("fc1", batch_size, fields * dim, 256, ["embedding"])
    act = _relu("act1", batch_size, 256, "fc1")
    fc2, fc2_vars = _linear("fc2", batch_size, 256, 1, ["act1"])
    layers += [fc1, act, fc2]
    variables += fc1_vars + fc2_vars
    return ModelGraph(
        name="recsys",
        batch_size=batch_size,
        optimizer={"kind": "adagrad", "state_bytes_per_param": 4.0},
        layers=layers,
        variables=variables,
        provenance={"source": "tests/conftest.py"},
    )


def make_awkward_graph(batch_size: int = 8) -> ModelGraph:
    """One layer per variable so every variable has a consumer; shapes chosen for partitioning rules."""
    shapes = {
        "prime7": ([7, 5], "float32"),
        "pow64": ([64, 3], "float32"),
        "six": ([6], "float32"),
        "nine": ([9, 4, 2], "float32"),
        "one": ([1, 12], "float32"),
        "scalar": ([], "float32"),
        "half": ([10, 10], "float16"),
    }
    variables = [Variable(name=f"{n}.weight", shape=s, dtype=d, consumer=n) for n, (s, d) in shapes.items()]
    variables.append(Variable(name="frozen.weight", shape=[4, 4], trainable=False, consumer="six"))
    layers: list[Layer] = []
    for n in shapes:
        uses = [f"{n}.weight"] + (["frozen.weight"] if n == "six" else [])
        layers.append(
            Layer(
                name=n,
                type="Custom",
                kind="other",
                fwd_flops=1000.0,
                bwd_flops=2000.0,
                bytes_moved=4096.0,
                activation_bytes=1024.0,
                output_bytes=1024.0,
                inputs=[layers[-1].name] if layers else [],
                variables=uses,
            )
        )
    return ModelGraph(
        name="awkward",
        batch_size=batch_size,
        layers=layers,
        variables=variables,
        provenance={"source": "tests/conftest.py"},
    )


def make_t4_cluster(nodes: int, gpus_per_node: int = 4, bandwidth_gbps: float = 50.0) -> ResourceSpec:
    """`nodes` g4dn-like machines 10.0.0.1, 10.0.0.2, ...; the first is the chief."""
    return ResourceSpec(
        name=f"t4-{nodes}x{gpus_per_node}",
        nodes=[
            Node(address=f"10.0.0.{i + 1}", chief=i == 0, gpus=list(range(gpus_per_node)), device="T4")
            for i in range(nodes)
        ],
        network={"kind": "ethernet", "bandwidth_gbps": bandwidth_gbps, "latency_us": 25},
    )


def make_cpu_cluster(cpus: int = 2) -> ResourceSpec:
    return ResourceSpec(
        name=f"cpu-1x{cpus}", nodes=[Node(address="127.0.0.1", chief=True, cpus=list(range(cpus)), device="CPU")]
    )


def make_loopback_cpus(name: str, device: DeviceSpec, bandwidth_gbps: float, latency_us: float = 100.0) -> ResourceSpec:
    """Two CPU ranks of one host on loopback, with the device kind `device`: what calibration describes."""
    link = Link(kind="loopback", bandwidth_gbps=bandwidth_gbps, latency_us=latency_us, efficiency=1.0)
    return ResourceSpec(
        name=name,
        nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1], device="CPU")],
        network=link,
        intra_node=link,
        devices={"CPU": device},
    )
