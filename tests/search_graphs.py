"""Small hand-built graphs and clusters for the search tests (no capture, so the tests stay fast).

The `test_search_*` modules import these helpers; this module holds no tests.
"""

from __future__ import annotations

from stratagem.ir import ModelGraph, ResourceSpec

FLOAT32 = 4


def _linear(name: str, rows: int, cols: int, tokens: int, inputs: list[str]) -> tuple[dict, list[dict]]:
    flops = 2.0 * tokens * rows * cols
    layer = {
        "name": name,
        "type": "Linear",
        "kind": "matmul",
        "fwd_flops": flops,
        "bwd_flops": 2 * flops,
        "bytes_moved": float((tokens * (rows + cols) + rows * cols) * FLOAT32),
        "activation_bytes": float(tokens * cols * FLOAT32),
        "output_bytes": float(tokens * rows * FLOAT32),
        "inputs": inputs,
        "variables": [f"{name}.weight", f"{name}.bias"],
    }
    variables = [{"name": f"{name}.weight", "shape": [rows, cols]}, {"name": f"{name}.bias", "shape": [rows]}]
    return layer, variables


def transformer_graph(layers: int = 4, hidden: int = 256, vocab: int = 1000, tokens: int = 512) -> ModelGraph:
    """A BERT-like encoder: embedding, then per block fused qkv, output, two FFN matmuls and a norm."""
    graph_layers: list[dict] = [
        {
            "name": "embed",
            "type": "Embedding",
            "kind": "embedding",
            "bytes_moved": float(tokens * hidden * FLOAT32),
            "activation_bytes": float(tokens * 8),
            "output_bytes": float(tokens * hidden * FLOAT32),
            "variables": ["embed.weight"],
        }
    ]
    variables: list[dict] = [{"name": "embed.weight", "shape": [vocab, hidden]}]
    previous = "embed"
    for i in range(layers):
        for name, rows, cols in (
            (f"b{i}.qkv", 3 * hidden, hidden),
            (f"b{i}.out", hidden, hidden),
            (f"b{i}.ffn1", 4 * hidden, hidden),
            (f"b{i}.ffn2", hidden, 4 * hidden),
        ):
            layer, weights = _linear(name, rows, cols, tokens, [previous])
            graph_layers.append(layer)
            variables.extend(weights)
            previous = name
        norm = f"b{i}.norm"
        graph_layers.append(
            {
                "name": norm,
                "type": "LayerNorm",
                "kind": "norm",
                "fwd_flops": 5.0 * tokens * hidden,
                "bwd_flops": 10.0 * tokens * hidden,
                "bytes_moved": float(2 * tokens * hidden * FLOAT32),
                "activation_bytes": float(tokens * hidden * FLOAT32),
                "output_bytes": float(tokens * hidden * FLOAT32),
                "inputs": [previous],
                "variables": [f"{norm}.weight", f"{norm}.bias"],
            }
        )
        variables += [{"name": f"{norm}.weight", "shape": [hidden]}, {"name": f"{norm}.bias", "shape": [hidden]}]
        previous = norm
    return ModelGraph.parse(
        {"name": "transformer", "batch_size": tokens // 128 or 1, "layers": graph_layers, "variables": variables}
    )


def recommender_graph(
    tables: tuple[int, ...] = (400_000, 100_000, 20_000, 1_000), dim: int = 64, batch: int = 512, pooling: int = 4
) -> ModelGraph:
    """DLRM-like: sparse embedding tables of different sizes (rows looked up per step), a dense MLP on top."""
    layers: list[dict] = []
    variables: list[dict] = []
    for t, rows in enumerate(tables):
        name = f"table{t}"
        lookups = batch * pooling
        layers.append(
            {
                "name": name,
                "type": "EmbeddingBag",
                "kind": "embedding",
                "bytes_moved": float(lookups * dim * FLOAT32),
                "activation_bytes": float(lookups * 8),
                "output_bytes": float(batch * dim * FLOAT32),
                "variables": [f"{name}.weight"],
            }
        )
        variables.append(
            {
                "name": f"{name}.weight",
                "shape": [rows, dim],
                "sparse": True,
                "lookups_per_step": lookups,
                "consumer": name,
            }
        )
    previous = [f"table{t}" for t in range(len(tables))]
    width = dim * len(tables)
    for i, out in enumerate((512, 256, 1)):
        layer, weights = _linear(f"mlp{i}", out, width, batch, previous)
        layers.append(layer)
        variables.extend(weights)
        previous, width = [f"mlp{i}"], out
    return ModelGraph.parse({"name": "recommender", "batch_size": batch, "layers": layers, "variables": variables})


def one_variable_graph(shape: list[int]) -> ModelGraph:
    layer = {
        "name": "scale",
        "kind": "elementwise",
        "fwd_flops": 1000.0,
        "bwd_flops": 2000.0,
        "variables": ["scale.weight"],
    }
    return ModelGraph.parse(
        {"name": "one", "batch_size": 8, "layers": [layer], "variables": [{"name": "scale.weight", "shape": shape}]}
    )


def cluster(nodes: int = 2, gpus: int = 4, gbps: float = 50.0, device: str = "T4") -> ResourceSpec:
    """`nodes` × `gpus` GPUs (g4dn.12xlarge-like by default), the first node chief."""
    return ResourceSpec.parse(
        {
            "name": f"{nodes}x{gpus}-{device}",
            "nodes": [
                {"address": f"10.0.0.{i + 1}", "gpus": list(range(gpus)), "chief": i == 0, "device": device}
                for i in range(nodes)
            ],
            "network": {"bandwidth_gbps": gbps},
        }
    )
