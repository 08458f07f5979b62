"""The same checks run in place when pytest itself is launched by torchrun (how a cluster runs the suite)."""

import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).parent / "torchrun_cases" / "in_place_checks.py"


def test_checks_run_in_place_under_torchrun() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "pytest", "-q", "-p", "no:cacheprovider", "--backend=gloo", str(CASES)],
        check=False, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert output.count("3 passed") == 2, output  # both ranks ran and passed all three
