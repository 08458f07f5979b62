"""The models are oracles independent of torch: importing any of them must not import torch."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import checks.models


def test_no_model_imports_torch() -> None:
    names = [f"checks.models.{m.name}" for m in pkgutil.iter_modules(checks.models.__path__)]
    assert names, "no models found"
    code = (
        "import sys\n"
        + "".join(f"import {n}\n" for n in names)
        + (
            "leaked = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\nprint(leaked[:5])\n"
            "sys.exit(1 if leaked else 0)\n"
        )
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"importing {names} imported torch: {done.stdout}{done.stderr}"
