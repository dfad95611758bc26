"""Trial memory: the high-water mark restarts where a trial's model is built."""

from __future__ import annotations

import sys

import pytest
import torch

from trial_runner.measure import current_memory_bytes, peak_memory_bytes, reset_peak_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reset is Linux's /proc/self/clear_refs")
def test_the_peak_forgets_what_was_freed_before_the_reset() -> None:
    cpu = torch.device("cpu")
    held = torch.ones(40_000_000)  # 160 MB resident
    before = peak_memory_bytes(cpu)
    del held
    reset_peak_memory(cpu)
    after = peak_memory_bytes(cpu)
    assert before - after > 100e6
    assert after >= current_memory_bytes(cpu) * 0.9
