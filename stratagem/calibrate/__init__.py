"""Measure this machine and describe it as a ResourceSpec, so trials here can be predicted.

`calibrate(ranks, threads=...)` measures `ranks` CPU ranks joined by gloo (`stratagem calibrate`);
`calibrate_gpu(index)` one CUDA device (`stratagem calibrate --gpu`). In about 15-30 seconds:

- `workers`: the ranks, started as processes joined by a process group, all measuring at once;
- `timing`: how a probe is timed (each repeat until every rank is done, from cold caches, the median);
- `compute`: the compute probes (matmul, convolution, memory-bound kernels, optimizer, compression);
- `collectives`: the collective probes, which run the runtime's own buckets (all-reduce, ZeRO,
  parameter server) on the ranks' process group;
- `figures`: the measured figures and how they become a `DeviceSpec` and a `ResourceSpec` (`reread`
  rebuilds a calibrated spec from the figures it recorded, `average` merges several);
- `gpu`: a CUDA device's figures, at sizes that keep it busy.
"""

from stratagem.calibrate.figures import DEVICE_KIND, average, reread, spec_from_figures
from stratagem.calibrate.gpu import calibrate_gpu
from stratagem.calibrate.workers import CalibrationError, calibrate

__all__ = [
    "DEVICE_KIND",
    "CalibrationError",
    "average",
    "calibrate",
    "calibrate_gpu",
    "reread",
    "spec_from_figures",
]
