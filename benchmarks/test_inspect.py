"""``fsdp-readings inspect``'s goals, measured, not asserted: ``inspect`` on mini_gpt at N=2 against
``fsdp-readings check`` on one guide (both as a user runs them: a fresh process, its own pool), and ``--meta``
on a 1.1B-parameter GPT-2 (wall seconds and peak resident memory of the process).

    pytest benchmarks/test_inspect.py

``extra_info`` holds the ratio and the peak memory (listed under the table by `benchmarks/conftest.py`).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = "checks.inspect.examples"


def _cli(*argv: str) -> tuple[float, int]:
    """Wall seconds and the child's peak resident set (bytes) of ``python -m reader ARGV``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "reader", *argv], cwd=REPO, env=env, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, max(peak, before) * 1024


@pytest.mark.benchmark(group="inspect")
def test_inspect_mini_gpt_against_checking_one_guide(benchmark) -> None:
    check, _ = _cli("check", "12-flat-parameter")
    inspect_args = (f"{EXAMPLES}:mini_gpt_tiny", "--input", f"{EXAMPLES}:mini_gpt_batch", "--wrap", "Block")
    seconds = benchmark.pedantic(lambda: _cli("inspect", *inspect_args)[0], rounds=2, iterations=1)
    benchmark.extra_info.update(check_one_guide_s=round(check, 2), inspect_over_check=round(seconds / check, 2))


@pytest.mark.benchmark(group="inspect")
def test_meta_on_a_billion_parameter_gpt2(benchmark) -> None:
    pytest.importorskip("transformers", reason="the models extra is not installed")
    argv = ("inspect", f"{EXAMPLES}:gpt2_1b", "--meta", "--wrap", "GPT2Block", "-n", "64", "--strategy", "full-shard")
    result = benchmark.pedantic(lambda: _cli(*argv), rounds=2, iterations=1)
    benchmark.extra_info.update(peak_resident_mb=round(result[1] / 1e6))
