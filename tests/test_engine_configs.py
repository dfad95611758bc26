"""Layouts in and out of torchtitan, DeepSpeed, Megatron-LM and Accelerate configs: the emitted files parse,
use only the engines' own key names, come back as the same strategy, and what an engine cannot express
is refused naming what and why.

Key names below are copied from each engine's source at the commit in `ENGINE_SOURCES`.
"""

from __future__ import annotations

import json
import tomllib

import pytest
import yaml
from layout_helpers import gpt_graph, gpu_cluster
from sample_documents import make_mlp_graph, make_t4_cluster

from stratagem import InvalidLayoutError, Layout, UnsupportedStrategyError
from stratagem.builders import PS
from stratagem.interop.engines import ENGINE_SOURCES, ENGINES, render

# torchtitan/config/job_config.py at e347b1e5 (sections the export writes, and their fields).
TORCHTITAN_FIELDS = {
    "training": {
        "local_batch_size",
        "global_batch_size",
        "seq_len",
        "dtype",
        "mixed_precision_param",
        "steps",
        "max_norm",
    },
    "parallelism": {
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "fsdp_reshard_after_forward",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "pipeline_parallel_layers_per_stage",
        "context_parallel_degree",
        "context_parallel_rotate_method",
        "enable_async_tensor_parallel",
    },
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "compile": {"enable", "components", "backend"},
    "model": {"converters"},
    "quantize": {"linear"},
}
# deepspeed/runtime/constants.py and config.py at 38327e07.
DEEPSPEED_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "bf16",
    "fp16",
    "tensor_parallel",
    "pipeline",
    "activation_checkpointing",
    "gradient_clipping",
}
# megatron/training/arguments.py and the config dataclasses its flags come from, at d98e8a64.
MEGATRON_FLAGS = {
    "--clip-grad",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--num-layers",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--sequence-parallel",
    "--micro-batch-size",
    "--global-batch-size",
    "--use-distributed-optimizer",
    "--num-distributed-optimizer-instances",
    "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--bf16",
    "--fp16",
    "--fp8-format",
    "--fp8-recipe",
    "--ddp-bucket-size",
}
# src/accelerate/commands/config/config_args.py (ClusterConfig fields) at 16cb6eb8.
ACCELERATE_KEYS = {
    "compute_environment",
    "debug",
    "distributed_type",
    "mixed_precision",
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_training_function",
    "use_cpu",
    "fsdp_config",
    "parallelism_config",
    "deepspeed_config",
    "fp8_config",
}

ROUND_TRIPS = {
    "torchtitan": [
        "zero=3,mb=2,gbs=64,precision=amp-bf16",
        "tp=2,sp,zero=3,mb=2,gbs=32,recompute=selective-op,precision=amp-bf16,compile",
        "tp=2,sp,async_tp,zero=3,mb=2,gbs=32,precision=fp8,fp8_ag,compile",
        "tp=2,pp=2,sp,zero=2,mb=2,gbs=64,schedule=interleaved-1f1b,vpp=2,precision=bf16,recompute=full",
        "pp=2,zero=3,mb=2,gbs=64,schedule=zero-bubble,vpp=2,precision=amp-bf16",
        "pp=2,zero=3,mb=2,gbs=64,schedule=gpipe",
        "dp=16,zero=3,shard=8,mb=2,gbs=32,precision=fp8",
        "cp=2,zero=3,mb=2,gbs=16",
        "dp=16,mb=2,gbs=128",
        "dp=16,mb=2,gbs=128,bucket=100",
    ],
    "deepspeed": [
        "zero=1,mb=2,gbs=64,precision=amp-bf16",
        "tp=2,zero=3,mb=2,gbs=64,precision=fp16,recompute=full",
        "pp=2,zero=1,mb=2,gbs=64,recompute=full,overlap=false",
        "dp=16,zero=3,shard=8,mb=2,gbs=32",
        "dp=16,mb=2,gbs=32,overlap=false",
        "zero=2,mb=2,gbs=64,overlap=false",
    ],
    "megatron": [
        "tp=2,pp=2,sp,async_tp,mb=2,gbs=64,zero=1,recompute=selective,precision=amp-bf16",
        "tp=2,sp,mb=2,gbs=64,zero=3,precision=fp8,fp8_ag",
        "tp=2,pp=2,sp,mb=2,gbs=64,schedule=interleaved-1f1b,vpp=2,precision=fp8",
        "cp=2,mb=2,gbs=64,zero=3,recompute=full",
        "zero=2,mb=2,gbs=32,precision=fp16",
        "mb=2,gbs=32,bucket=40",
        "pp=2,mb=2,gbs=64,zero=1,overlap=false",
    ],
    "accelerate": [
        "zero=3,precision=amp-bf16",
        "tp=2,zero=3,shard=4,recompute=full",
        "tp=2,cp=2,compile",
        "dp=16",
        "zero=2,precision=fp8",
        "zero=1,gbs=128,overlap=false",
    ],
}


def _cases() -> list[tuple[str, str]]:
    return [(engine, text) for engine, texts in ROUND_TRIPS.items() for text in texts]


@pytest.mark.parametrize("engine", ["deepspeed", "megatron"])
def test_autocast_fp16_exports_to_the_engines_fp16_which_reads_back_as_an_fp16_model(engine: str) -> None:
    """Neither engine has an autocast switch: `fp16.enabled` and `--fp16` halve the model and step fp32
    master copies, so what an amp-fp16 layout exports to imports as `fp16`."""
    exported = getattr(Layout.from_string("zero=1,mb=2,gbs=32,precision=amp-fp16"), f"to_{engine}")()
    assert exported == getattr(Layout.from_string("zero=1,mb=2,gbs=32,precision=fp16"), f"to_{engine}")()
    assert getattr(Layout, f"from_{engine}")(exported).precision == "fp16"


@pytest.mark.parametrize(("engine", "text"), _cases())
def test_an_exported_config_imports_as_the_same_strategy(engine: str, text: str) -> None:
    graph, cluster = gpt_graph(), gpu_cluster(2, 8)
    strategy = Layout.from_string(text).build(graph, cluster)
    exported = getattr(strategy, f"to_{engine}")(graph)
    imported = getattr(Layout, f"from_{engine}")(exported)
    assert imported.build(graph, cluster).id == strategy.id, f"{engine}: {exported!r} -> {imported}"


@pytest.mark.parametrize("text", ROUND_TRIPS["torchtitan"])
def test_torchtitan_configs_parse_as_toml_with_torchtitans_own_fields(text: str) -> None:
    graph = gpt_graph()
    config = tomllib.loads(Layout.from_string(text).build(graph, gpu_cluster(2, 8)).to_torchtitan(graph))
    for section, table in config.items():
        assert section in TORCHTITAN_FIELDS and set(table) <= TORCHTITAN_FIELDS[section], section
    assert config["training"]["local_batch_size"] >= 1
    float8 = config.get("quantize", {}).get("linear", {}).get("float8", {})
    assert set(float8) <= {"recipe_name", "enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp"}


def test_torchtitan_writes_fsdp_hsdp_and_the_pipeline_in_its_own_words() -> None:
    graph = gpt_graph()
    hybrid = tomllib.loads(Layout.from_string("dp=16,zero=3,shard=8,mb=2,gbs=32,precision=fp8").to_torchtitan())
    assert hybrid["parallelism"]["data_parallel_replicate_degree"] == 2
    assert hybrid["parallelism"]["data_parallel_shard_degree"] == 8
    assert "context_parallel_rotate_method" not in hybrid["parallelism"]
    context = tomllib.loads(Layout.from_string("cp=2,zero=3,mb=2,gbs=16").to_torchtitan())["parallelism"]
    assert context["context_parallel_rotate_method"] == "allgather", "the rotation the simulator prices"
    assert hybrid["model"]["converters"] == ["quantize.linear.float8"]
    assert hybrid["quantize"]["linear"]["float8"]["recipe_name"] == "tensorwise"
    text = "tp=2,pp=2,sp,zero=2,mb=2,gbs=64,schedule=interleaved-1f1b,vpp=2,precision=bf16"
    piped = tomllib.loads(Layout.from_string(text).build(graph, gpu_cluster(2, 8)).to_torchtitan(graph))
    assert piped["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert piped["parallelism"]["pipeline_parallel_microbatch_size"] == 2
    assert piped["parallelism"]["fsdp_reshard_after_forward"] == "never"
    assert piped["training"] == {
        "local_batch_size": 16,
        "global_batch_size": 64,
        "dtype": "bfloat16",
        "mixed_precision_param": "bfloat16",
    }


def test_deepspeed_configs_are_json_with_deepspeeds_own_keys() -> None:
    graph = gpt_graph()
    strategy = Layout.from_string("tp=2,pp=2,zero=1,mb=2,gbs=64,recompute=full,precision=amp-bf16,overlap=false").build(
        graph, gpu_cluster(2, 8)
    )
    config = json.loads(render("deepspeed", strategy.to_deepspeed(graph)))
    assert set(config) <= DEEPSPEED_KEYS
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"]) == (64, 2)
    assert config["gradient_accumulation_steps"] == 64 // (2 * 4)
    assert config["zero_optimization"] == {"stage": 1, "overlap_comm": False} and config["bf16"] == {"enabled": True}
    assert config["tensor_parallel"] == {"autotp_size": 2}
    assert config["pipeline"] == {"stages": 2, "activation_checkpoint_interval": 1}
    assert Layout.from_string("dp=16,zero=3,shard=8").to_deepspeed()["zero_optimization"]["mics_shard_size"] == 8


def test_megatron_arguments_use_megatrons_own_flags() -> None:
    graph = gpt_graph()
    text = "tp=2,pp=2,sp,mb=2,gbs=64,schedule=interleaved-1f1b,vpp=2,zero=1,recompute=selective,precision=fp8"
    args = Layout.from_string(text).build(graph, gpu_cluster(2, 8)).to_megatron(graph)
    assert {word for word in args if word.startswith("--")} <= MEGATRON_FLAGS
    pairs = dict(zip(args, [*args[1:], ""], strict=True))
    assert pairs["--num-layers-per-virtual-pipeline-stage"] == "1" and pairs["--num-layers"] == "4"
    assert pairs["--recompute-granularity"] == "selective" and pairs["--fp8-format"] == "hybrid"
    assert "--sequence-parallel" in args and "--use-distributed-optimizer" in args and "--bf16" in args
    assert render("megatron", args).startswith("--tensor-model-parallel-size 2 \\\n--pipeline-model-parallel-size 2")


@pytest.mark.parametrize(("zero", "param_gather"), [(0, False), (1, False), (2, False), (3, True)])
def test_megatron_is_told_to_overlap_what_the_simulator_prices_overlapped(zero: int, param_gather: bool) -> None:
    """Megatron reduces gradients after backward unless `--overlap-grad-reduce` (and gathers a zero-3
    unit's parameters only when needed unless `--overlap-param-gather`); the simulator overlaps both."""
    args = Layout.from_string(f"dp=8,zero={zero},mb=1,gbs=8").to_megatron()
    assert "--overlap-grad-reduce" in args and ("--overlap-param-gather" in args) == param_gather


def test_accelerate_configs_are_yaml_with_fsdp2_and_the_parallelism_config() -> None:
    graph = gpt_graph()
    strategy = Layout.from_string("tp=2,zero=3,shard=4,recompute=full,precision=amp-bf16").build(
        graph, gpu_cluster(2, 8)
    )
    config = yaml.safe_load(strategy.to_accelerate(graph))
    assert set(config) <= ACCELERATE_KEYS
    assert config["distributed_type"] == "FSDP" and config["num_processes"] == 16 and config["num_machines"] == 2
    assert config["fsdp_config"]["fsdp_version"] == 2 and config["fsdp_config"]["fsdp_activation_checkpointing"]
    assert config["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 2,
        "parallelism_config_dp_shard_size": 4,
        "parallelism_config_tp_size": 2,
        "parallelism_config_cp_size": 1,
    }
    assert yaml.safe_load(Layout(data=8).to_accelerate())["distributed_type"] == "MULTI_GPU"


@pytest.mark.parametrize(
    ("engine", "text", "reason"),
    [
        ("torchtitan", "dp=8,tp=2,zero=3", "tensor parallelism without sequence parallelism"),
        ("torchtitan", "dp=4,tp=2,sp", "torchtitan runs DDP only as the sole parallelism"),
        ("torchtitan", "dp=8,zero=1", "zero 1: FSDP2 shards parameters and gradients with the optimizer state"),
        ("torchtitan", "dp=8,precision=amp-fp16", "mixed_precision_param takes bfloat16 or float32 only"),
        ("torchtitan", "dp=8,precision=fp16", "mixed_precision_param takes bfloat16 or float32 only"),
        ("accelerate", "dp=8,precision=fp16", "mixed_precision fp16 is autocast over fp32 weights"),
        ("torchtitan", "dp=1,tp=8,sp,precision=amp-bf16", "without it trains in fp32"),
        ("torchtitan", "dp=4,pp=2,zero=3,schedule=zero-bubble", "zero-bubble with one chunk per rank"),
        ("torchtitan", "dp=8,precision=tf32", "no config key turns on TF32 matmuls"),
        ("torchtitan", "dp=4,tp=2,sp,async_tp,zero=3", "async tensor parallelism without compile"),
        ("deepspeed", "dp=8,recompute=selective", "the config has no granularity"),
        ("deepspeed", "dp=4,tp=2,sp", "AutoTP training splits no norms along the sequence"),
        ("deepspeed", "dp=4,cp=2", "DeepSpeed-Ulysses splits heads"),
        ("deepspeed", "dp=4,pp=2,schedule=gpipe", "runs its own 1F1B schedule"),
        ("deepspeed", "dp=4,pp=2,zero=2", "accepts ZeRO stages 0 and 1"),
        ("deepspeed", "dp=8,precision=bf16", "keeps fp32 master weights"),
        ("deepspeed", "dp=8,zero=2,shard=4", "MiCS (mics_shard_size), a ZeRO-3 feature"),
        ("deepspeed", "dp=4,tp=2,sp,async_tp,zero=1", "overlaps tensor-parallel collectives"),
        ("accelerate", "dp=8,zero=3,precision=fp8,fp8_ag", "enable_fsdp_float8_all_gather=True"),
        ("megatron", "dp=4,pp=2,schedule=gpipe", "Megatron runs 1F1B, interleaved with virtual stages"),
        ("megatron", "dp=4,pp=2,schedule=zero-bubble,vpp=2", "Megatron runs 1F1B"),
        ("megatron", "dp=8,zero=3,shard=4", "hybrid sharding is the distributed optimizer's instances"),
        ("megatron", "dp=8,precision=bf16", "keeps fp32 main weights"),
        ("megatron", "dp=auto,mb=1,m=4", "--global-batch-size needs it"),
        ("accelerate", "dp=4,pp=2", "only through the Megatron-LM plugin"),
        ("accelerate", "dp=8,recompute=selective", "recomputes whole blocks"),
        ("accelerate", "dp=4,tp=2,sp", "the transformers tp_plan splits no norms"),
        ("accelerate", "dp=4,tp=2,zero=1", "zero 1 is DeepSpeed's stage 1 here"),
        ("accelerate", "tp=2", "resolve the layout for a device count first"),
        ("deepspeed", "dp=8,bucket=50", "DeepSpeed's stage 0 all-reduces the gradients after backward"),
        ("deepspeed", "dp=4,pp=2,zero=1", "DeepSpeed's pipeline engine reduces the gradients after the schedule"),
        ("torchtitan", "dp=8,zero=2,overlap=false", "torchtitan's DDP and FSDP reduce gradients during backward"),
        ("accelerate", "dp=8,zero=1", "the DeepSpeed plugin writes no overlap_comm"),
        ("accelerate", "dp=8,overlap=false", "DDP and FSDP reduce gradients during backward"),
        ("torchtitan", "dp=8,bucket=50", "torchtitan's DDP buckets at 100 MiB (apply_ddp)"),
    ],
)
def test_what_an_engine_cannot_express_is_refused_naming_what_and_why(engine: str, text: str, reason: str) -> None:
    with pytest.raises(UnsupportedStrategyError) as error:
        getattr(Layout.from_string(text), f"to_{engine}")()
    assert str(error.value).startswith(f"{engine} cannot express this layout: ") and reason in str(error.value)


@pytest.mark.parametrize("engine", ENGINES)
def test_per_variable_strategies_are_refused_by_every_engine(engine: str) -> None:
    strategy = PS().build(make_mlp_graph(), make_t4_cluster(2))
    with pytest.raises(UnsupportedStrategyError, match=f"^{engine} cannot express this strategy: .*parameter server"):
        getattr(strategy, f"to_{engine}")()


def test_every_engine_names_the_source_it_follows() -> None:
    assert set(ENGINE_SOURCES) == set(ENGINES)
    assert all("@" in source and len(source.split("@")[1].split()[0]) == 40 for source in ENGINE_SOURCES.values())


# --- configs as their engines ship them ------------------------------------------------------------

TORCHTITAN_LLAMA3_8B = """
# torchtitan/models/llama3/train_configs/llama3_8b.toml at e347b1e5 (the sections a layout reads)
[model]
name = "llama3"
flavor = "8B"
# converters = ["float8"]

[training]
local_batch_size = 1
seq_len = 8192
max_norm = 1.0  # grad norm clipping
steps = 1000
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1

[activation_checkpoint]
mode = "selective"  # ["none", "selective", "full"]
selective_ac_option = "op"  # "int" = ac every positive int layer or 'op', ac based on ops policy

[quantize.linear.float8]
enable_fsdp_float8_all_gather = false
precompute_float8_dynamic_scale_for_fsdp = false
filter_fqns = ["output"]
"""

MEGATRON_GPT3_175B = """
--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048
--micro-batch-size 1 --global-batch-size 1536
--step-batch-size-schedule "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536"
--train-iters 500000 --weight-decay 0.1 --clip-grad 1.0 --fp16 --lr 6.0e-5
--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16
"""

ACCELERATE_TP_HSDP = """
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: false
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
parallelism_config:
  parallelism_config_cp_size: 1
  parallelism_config_dp_replicate_size: 2
  parallelism_config_dp_shard_size: 2
  parallelism_config_tp_size: 2
rdzv_backend: static
same_network: true
"""


def test_torchtitans_llama3_8b_config_reads_as_fsdp_over_the_rest_of_the_cluster() -> None:
    layout = Layout.from_torchtitan(TORCHTITAN_LLAMA3_8B)
    assert str(layout) == "dp=auto,mb=1,zero=3,recompute=selective-op,precision=amp-bf16"
    assert layout.build(gpt_graph(batch=1), gpu_cluster(4, 8)).effective_mesh.data == 32


def test_megatrons_gpt3_175b_arguments_read_as_tp8_pp16_on_any_cluster_they_divide() -> None:
    layout = Layout.from_megatron(MEGATRON_GPT3_175B)
    assert str(layout) == "dp=auto,tp=8,pp=16,mb=1,gbs=1536,overlap=false,precision=fp16"
    assert layout.resolved(1536).data == 12


def test_accelerates_tp_hsdp_example_reads_as_hybrid_sharding_with_tensor_parallelism() -> None:
    layout = Layout.from_accelerate(ACCELERATE_TP_HSDP)
    assert str(layout) == "dp=4,tp=2,zero=3,shard=2,precision=amp-bf16"


def test_a_hugging_face_deepspeed_config_reads_its_stated_knobs_and_refuses_auto_precision() -> None:
    config = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": 3, "overlap_comm": True},
    }
    assert str(Layout.from_deepspeed(config)) == "dp=auto,zero=3"
    with pytest.raises(InvalidLayoutError, match=r"bf16\.enabled: 'auto' leaves the precision"):
        Layout.from_deepspeed({**config, "bf16": {"enabled": "auto"}})


@pytest.mark.parametrize(
    ("engine", "config", "message"),
    [
        ("torchtitan", "[parallelism\n", "torchtitan: not TOML"),
        (
            "torchtitan",
            "[parallelism]\ndata_parallel_replicate_degree = 2\n",
            "data_parallel_shard_degree: -1 beside data_parallel_replicate_degree(2)",
        ),
        (
            "torchtitan",
            '[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "DualPipeV"\n',
            "'DualPipeV' has no layout schedule",
        ),
        ("torchtitan", "[parallelism]\ntensor_parallel_degree = 0\n", "must be a positive integer, got 0"),
        (
            "torchtitan",
            "[parallelism]\ntensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n"
            '[activation_checkpoint]\nmode = "none"\n',
            "enable_async_tensor_parallel: needs [compile] enable",
        ),
        ("deepspeed", "{not json", "deepspeed: not JSON"),
        ("deepspeed", '{"zero_optimization": {"stage": 5}}', "zero_optimization.stage: must be 0, 1, 2 or 3"),
        (
            "deepspeed",
            '{"zero_optimization": {"stage": 2, "overlap_comm": "yes"}}',
            "zero_optimization.overlap_comm: must be true or false, got 'yes'",
        ),
        ("megatron", "--tensor-model-parallel-size two", "must be a positive integer, got 'two'"),
        (
            "megatron",
            "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2",
            "gives virtual stages only with --num-layers",
        ),
        ("megatron", "--micro-batch-size", "--micro-batch-size: is missing its value"),
        ("accelerate", "distributed_type: XLA\n", "XLA has no layout"),
        ("accelerate", "distributed_type: FSDP\nmixed_precision: fp4\n", "mixed_precision: must be one of"),
        ("accelerate", "a: [b\n", "accelerate: not YAML"),
    ],
)
def test_a_config_that_is_not_a_layout_says_which_key_and_why(engine: str, config: str, message: str) -> None:
    with pytest.raises(InvalidLayoutError) as error:
        getattr(Layout, f"from_{engine}")(config)
    assert message in str(error.value)


def test_compile_is_each_engines_own_switch_and_megatron_has_none() -> None:
    titan = tomllib.loads(Layout.from_string("dp=8,zero=3,mb=2,compile").to_torchtitan())
    assert titan["compile"] == {"enable": True, "components": ["model", "loss"]}
    only_loss = "[compile]\nenable = true\ncomponents = ['loss']\n[activation_checkpoint]\nmode = 'none'\n"
    assert not Layout.from_torchtitan(only_loss).compile
    accelerate = yaml.safe_load(Layout.from_string("dp=8,compile").to_accelerate())
    assert accelerate["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}
    assert Layout.from_accelerate("distributed_type: MULTI_GPU\nnum_processes: 8\ndynamo_backend: INDUCTOR\n").compile
    assert Layout.from_string("tp=2,compile").to_megatron() == Layout.from_string("tp=2").to_megatron()
    assert not Layout.from_megatron("--tensor-model-parallel-size 2").compile
    with pytest.raises(UnsupportedStrategyError, match=r"engine\.compile"):
        Layout.from_string("dp=8,compile").to_deepspeed()


def test_torchtitan_checkpoints_per_op_or_per_layer_never_the_attention_core_alone() -> None:
    with pytest.raises(UnsupportedStrategyError, match="per op"):
        Layout.from_string("dp=8,zero=3,recompute=selective").to_torchtitan()
    with pytest.raises(InvalidLayoutError, match="every n-th layer"):
        Layout.from_torchtitan('[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "2"\n')


def test_each_engine_clips_as_the_graph_does_and_keeps_its_default_without_a_graph() -> None:
    """DeepSpeed's `gradient_clipping` and Megatron-LM's `--clip-grad` turn off at 0 (Megatron's default of
    1.0 clips); torchtitan clips every step at `training.max_norm`; Accelerate clips in the script."""
    plain = gpt_graph()
    clipped = plain.replace(optimizer=plain.optimizer.model_copy(update={"max_grad_norm": 0.5}))
    layout = Layout.from_string("dp=16,zero=3,mb=2,gbs=32,precision=amp-bf16")
    strategy, clipping = layout.build(plain, gpu_cluster(2, 8)), layout.build(clipped, gpu_cluster(2, 8))
    assert clipping.to_deepspeed(clipped)["gradient_clipping"] == 0.5
    assert strategy.to_deepspeed(plain)["gradient_clipping"] == 0.0
    assert "gradient_clipping" not in layout.to_deepspeed()
    args = clipping.to_megatron(clipped)
    assert args[args.index("--clip-grad") + 1] == "0.5"
    args = strategy.to_megatron(plain)
    assert args[args.index("--clip-grad") + 1] == "0.0"
    assert "--clip-grad" not in layout.to_megatron()
    assert tomllib.loads(clipping.to_torchtitan(clipped))["training"]["max_norm"] == 0.5
    text = strategy.to_torchtitan(plain)
    assert "max_norm" not in tomllib.loads(text)["training"] and "the graph does not clip" in text
    assert "accelerator.clip_grad_norm_(model.parameters(), 0.5)" in clipping.to_accelerate(clipped)
    assert "clip_grad_norm_" not in strategy.to_accelerate(plain)
    for engine in ENGINES:
        imported = getattr(Layout, f"from_{engine}")(getattr(clipping, f"to_{engine}")(clipped))
        assert imported.build(clipped, gpu_cluster(2, 8)).id == clipping.id, engine


def test_ddps_bucket_cap_is_each_engines_own_setting() -> None:
    layout = Layout.from_string("dp=8,mb=2,gbs=16,bucket=40")
    args = layout.to_megatron()
    assert args[args.index("--ddp-bucket-size") + 1] == str(40 * 2**20 // 4)
    assert Layout.from_megatron([*args, "--use-distributed-optimizer"]).bucket_mb is None
    plain = Layout.from_string("dp=8,mb=2,gbs=16").to_megatron()
    assert plain[plain.index("--ddp-bucket-size") + 1] == str(25 * 2**20 // 4)
    assert Layout.from_megatron(plain).bucket_mb is None
    assert "--ddp-bucket-size" not in Layout.from_string("dp=8,zero=1").to_megatron()
    assert "DistributedDataParallelKwargs(bucket_cap_mb=40)" in layout.to_accelerate().splitlines()[0]
    assert "bucket_cap_mb" not in Layout.from_string("dp=8").to_accelerate()
    ddp = Layout.from_torchtitan(Layout.from_string("dp=8,mb=2,gbs=16").to_torchtitan())
    assert (ddp.zero, ddp.bucket_mb) == (0, 100)
    assert Layout.from_torchtitan(Layout.from_string("dp=8,zero=3").to_torchtitan()).bucket_mb is None


def test_each_engine_reduces_gradients_during_backward_only_where_it_says_so() -> None:
    ds = Layout.from_string("dp=8,zero=2,mb=2,gbs=16").to_deepspeed()
    assert ds["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert Layout.from_deepspeed(ds).overlap_grad_reduce
    assert not Layout.from_deepspeed({"zero_optimization": {"stage": 2}}).overlap_grad_reduce
    assert not Layout.from_deepspeed({"zero_optimization": {"stage": 0}}).overlap_grad_reduce
    assert Layout.from_deepspeed({"zero_optimization": {"stage": 3}}).overlap_grad_reduce
    args = Layout.from_string("dp=8,mb=2,gbs=16,overlap=false").to_megatron()
    assert "--overlap-grad-reduce" not in args and not Layout.from_megatron(args).overlap_grad_reduce
    assert Layout.from_megatron([*args, "--overlap-grad-reduce"]).overlap_grad_reduce
    late = Layout.from_megatron([*args, "--ddp-bucket-size", "10000000"])
    assert (late.overlap_grad_reduce, late.bucket_mb) == (False, None)
    accelerate = Layout.from_string("dp=8,zero=1,overlap=false").to_accelerate()
    assert not Layout.from_accelerate(accelerate).overlap_grad_reduce
    assert Layout.from_accelerate(Layout.from_string("dp=8").to_accelerate()).overlap_grad_reduce
