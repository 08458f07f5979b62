"""README's quick start, as the commands CI runs: the lines of the first ```bash block under "## Quick start".

CI runs exactly what a newcomer copies, with nothing activated, so a command that only works inside an activated
venv fails here first. Usage: ``python3 .ci/quick_start.py [README]`` prints one command per line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HEADING = "## Quick start"
FENCE = re.compile(r"^```bash\n(?P<body>.*?)^```", re.M | re.S)


def commands(readme: str) -> list[str]:
    """The quick start's commands; a ValueError names what is missing."""
    section = re.search(rf"^{re.escape(HEADING)}$", readme, re.M)
    if section is None:
        raise ValueError(f"README has no `{HEADING}` section")
    block = FENCE.search(readme, section.end())
    if block is None:
        raise ValueError(f"README's `{HEADING}` has no ```bash block")
    found = [line.strip() for line in block.group("body").splitlines() if line.strip()]
    if not found or any(line.startswith("#") for line in found):
        raise ValueError(f"README's `{HEADING}` block must hold commands only, one per line")
    return found


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "README.md"
    try:
        print("\n".join(commands(path.read_text(encoding="utf-8"))))
    except ValueError as exc:
        sys.exit(f"{path}: {exc}")
