"""DeepSpeed's own timings of the autotuning source's runs: the step the simulator prices, without the
Hugging Face Trainer around it.

The source's rows (`deepspeed_autotuning_hf`) are `train_samples_per_second` of HF Trainer 4.12 over
200 steps, end to end. The same READMEs also give, for every ZeRO stage the autotuner tried, the best
throughput DeepSpeed's engine timed: "calculated using the timings captured within DeepSpeed forward,
backward and step functions. The sum of these timings is less than the actual training step latency"
(DeepSpeedExamples@83757d9c, training/autotuning/hf/<model>/README.md, "Detailed `HF + DS autotuning`
Result Summary"). Those are the forward, backward and optimizer step alone, each timed to the device's
completion, on the same 16 V100 node, for ZeRO stages 0-3 at micro-batches the autotuner chose.

Two uses: the same configuration's end-to-end row less its engine-timed step is what the Trainer's loop
costs outside the engine (data loading, host syncs), which the simulator does not price; and the
stages' order for one model is the ZeRO choice a user asks the service to make.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from benchmarks.lib.published_rows import Row

SOURCE = "deepspeed_engine_timed"
README = (
    "microsoft/DeepSpeedExamples@83757d9c937daabd1089a08051061706cb73900d:training/autotuning/hf/{folder}/README.md"
)
GPUS = 16
"""One node of 16 V100s, as the source's rows."""

FRAMEWORK = "HF transformers 4.12 + DeepSpeed (engine timers)"

ENGINE_TIMED: list[tuple[str, str, int, int, float]] = [
    ("distilbert-base-uncased", "distilbert", 0, 256, 5759.96),
    ("distilbert-base-uncased", "distilbert", 1, 256, 5667.06),
    ("distilbert-base-uncased", "distilbert", 2, 256, 5366.97),
    ("distilbert-base-uncased", "distilbert", 3, 256, 4892.49),
    ("bert-base-cased", "bert-base", 0, 235, 2930.18),
    ("bert-base-cased", "bert-base", 1, 235, 2930.17),
    ("bert-base-cased", "bert-base", 2, 235, 2744.16),
    ("bert-base-cased", "bert-base", 3, 238, 2479.47),
    ("bert-large-uncased", "bert-large", 0, 93, 835.244),
    ("bert-large-uncased", "bert-large", 1, 93, 842.243),
    ("bert-large-uncased", "bert-large", 2, 94, 764.524),
    ("gpt2", "gpt2", 0, 11, 441.693),
    ("gpt2", "gpt2", 1, 15, 452.004),
    ("gpt2-medium", "gpt2-medium", 0, 5, 167.688),
    ("gpt2-medium", "gpt2-medium", 1, 6, 175.46),
    ("gpt2-medium", "gpt2-medium", 2, 6, 161.619),
    ("gpt2-large", "gpt2-large", 0, 2, 59.0229),
    ("gpt2-large", "gpt2-large", 1, 3, 87.3017),
    ("gpt2-large", "gpt2-large", 2, 3, 77.8338),
    ("gpt2-xl", "gpt2-xl", 1, 1, 40.1749),
    ("gpt2-xl", "gpt2-xl", 2, 1, 33.0472),
    ("gpt2-xl", "gpt2-xl", 3, 1, 12.8604),
    ("microsoft/deberta-v2-xxlarge", "deberta", 1, 11, 177.843),
    ("microsoft/deberta-v2-xxlarge", "deberta", 2, 14, 154.002),
]
"""(Hugging Face model, README folder, ZeRO stage, micro-batch per GPU, samples/s) of each stage's best
experiment at one gradient-accumulation step (`z<stage>_gas1_tmbspg<micro-batch>`, "best_metric_val");
stages whose experiments all failed (a value of 0) and the tuned bucket sizes of DeBERTa's full mode are
left out."""


def engine_timed_rows(rows: list[Row]) -> list[Row]:
    """The engine-timed runs as rows: each a copy of the source's row for the same model (its source,
    so it is captured and priced as that source's runs are: precision, sequence, attention, node), at
    the stage and micro-batch DeepSpeed timed. Their ids start with `SOURCE`."""
    by_model: dict[str, Row] = {}
    for row in rows:
        if row.source == "deepspeed_autotuning_hf":
            by_model.setdefault(row.model, row)
    out = []
    for index, (model, folder, stage, micro_batch, samples_per_s) in enumerate(ENGINE_TIMED, start=1):
        base = by_model.get(model)
        if base is None:
            continue
        global_batch = micro_batch * GPUS
        other: dict[str, Any] = {**base.other, "variant": f"engine_timed_z{stage}", "framework": FRAMEWORK}
        out.append(
            dataclasses.replace(
                base,
                id=f"{SOURCE}:{index}",
                source_path=README.format(folder=folder),
                global_batch=global_batch,
                micro_batch=micro_batch,
                zero_stage=stage,
                other=other,
                measured_metric="engine_timed_samples_per_s",
                measured_value=samples_per_s,
                notes="DeepSpeed's forward + backward + step timers, the autotuner's throughput metric",
                measured_step_s=global_batch / samples_per_s,
                raw={},
            )
        )
    return out


def outside_engine(rows: list[Row], engine_timed: list[Row]) -> list[dict[str, Any]]:
    """For each end-to-end autotuned row whose configuration DeepSpeed also timed (`engine_timed`, from
    `engine_timed_rows`): the seconds per step the Trainer's loop spends outside the engine."""
    timed = {(r.model, r.zero_stage, r.micro_batch): r for r in engine_timed}
    out = []
    for row in rows:
        if row.source != "deepspeed_autotuning_hf" or not str(row.other.get("variant", "")).endswith("autotuned"):
            continue
        engine = timed.get((row.model, row.zero_stage, row.micro_batch))
        if engine is None:
            continue
        out.append(
            {
                "id": row.id,
                "model": row.model,
                "end_to_end_step_s": round(row.measured_step_s, 4),
                "engine_step_s": round(engine.measured_step_s, 4),
                "outside_engine_s": round(row.measured_step_s - engine.measured_step_s, 4),
            }
        )
    return out
