"""The three documents Stratagem exchanges: ModelGraph, ResourceSpec and Strategy."""

from stratagem.ir.catalog import CATALOG, DeviceSpec
from stratagem.ir.document import SCHEMA_VERSION, Document, canonical_json
from stratagem.ir.dtypes import DType
from stratagem.ir.graph import Layer, LayerKind, ModelGraph, OptimizerSpec, Variable
from stratagem.ir.resources import Link, Node, ResourceSpec, device_address, parse_device
from stratagem.ir.strategy import (
    AllReduceSynchronizer,
    Compressor,
    Consistency,
    MeasuredPerformance,
    Mesh,
    Partition,
    PipelineConfig,
    PredictedPerformance,
    Provenance,
    PSSynchronizer,
    ShardedSynchronizer,
    Strategy,
    Synchronizer,
    TensorParallelLayer,
    VariableConfig,
    shard_numel,
    shard_sizes,
)

__all__ = [
    "CATALOG",
    "SCHEMA_VERSION",
    "AllReduceSynchronizer",
    "Compressor",
    "Consistency",
    "DType",
    "DeviceSpec",
    "Document",
    "Layer",
    "LayerKind",
    "Link",
    "MeasuredPerformance",
    "Mesh",
    "ModelGraph",
    "Node",
    "OptimizerSpec",
    "PSSynchronizer",
    "Partition",
    "PipelineConfig",
    "PredictedPerformance",
    "Provenance",
    "ResourceSpec",
    "ShardedSynchronizer",
    "Strategy",
    "Synchronizer",
    "TensorParallelLayer",
    "Variable",
    "VariableConfig",
    "canonical_json",
    "device_address",
    "parse_device",
    "shard_numel",
    "shard_sizes",
]
