#!/usr/bin/env bash
# The checks a lent GPU runs, in one call of about seven minutes (docs/simulator.md, "Calibration"): the
# CUDA tests, the kernels of the published torchtitan rows at their own shapes, one rank's context-parallel
# attention, what the caching allocator reserves beyond a step's peak, one-rank trials of zoo models
# beside their predictions, and the gradient clip's cost beside its price. Each result lands in OUT
# (default ./gpu-check) as JSON or text, every step's stderr in OUT/stderr.txt (eight files: the device
# tool brings back eight at most); a step that fails is reported and the next one runs.
#
#   OUT=/some/folder bash benchmarks/gpu_check.sh
#
# A machine whose Python lacks pydantic (the library's one requirement beyond torch and numpy) or torchao
# (the fp8 test) takes them as wheels in .whl/, downloaded beforehand where pip can reach the registry.
set -u
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total,driver_version --format=csv | tee "$OUT/board.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

timeout 150 python3 -m benchmarks.gpu_kernel_shapes > "$OUT/gpu_kernel_shapes.json" 2>> "$OUT/stderr.txt"
echo "gpu_kernel_shapes: exit $?"

timeout 150 python3 -m benchmarks.gpu_context_parallel > "$OUT/gpu_context_parallel.json" 2>> "$OUT/stderr.txt"
echo "gpu_context_parallel: exit $?"

timeout 120 python3 -m benchmarks.gpu_memory_reserve > "$OUT/gpu_memory_reserve.json" 2>> "$OUT/stderr.txt"
echo "gpu_memory_reserve: exit $?"

timeout 240 python3 -m pytest -q -p no:cacheprovider -rs -m "slow or not slow" tests/test_trial_cuda.py \
    "tests/test_runtime_numerics.py::test_fp8_trains_on_an_fp8_gpu" > "$OUT/cuda_tests.txt" 2>&1
echo "cuda tests: exit $?"; tail -n 5 "$OUT/cuda_tests.txt"

kind=$(python3 -c "import torch; from stratagem.calibrate.gpu import catalog_kind; p = torch.cuda.get_device_properties(0); print(catalog_kind(p.name, p.total_memory) or 'H100')")
timeout 150 python3 -m benchmarks.gpu_one_rank --device "$kind" > "$OUT/gpu_one_rank.json" 2>> "$OUT/stderr.txt"
echo "gpu_one_rank: exit $?"

timeout 90 python3 -m benchmarks.clip_cost --device cuda --kind "$kind" --repeats 50 > "$OUT/clip_cost.json" 2>> "$OUT/stderr.txt"
echo "clip_cost: exit $?"
