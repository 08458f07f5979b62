"""``fsdp-readings memory``: the picture's numbers are the probe's, in the terminal and in the SVG."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest
from tests.study.test_commands import ANSI, run

CLAIM = "memory-over-the-step"
CHECK = "checks.guides.g03_unshard_reshard:memory_over_the_step"


def test_the_picture_draws_the_probes_numbers(pool: PoolManager, data_dir, tmp_path: Path) -> None:
    probe = pool.run(CheckRequest(CHECK)).values()[0]["series"]
    picture = tmp_path / "memory.svg"
    code, out = run(["memory", "03-unshard-reshard", CLAIM, "--svg", str(picture)], pool, width=80)
    assert code == 0, out
    assert max(len(line) for line in out.splitlines()) <= 80 and not ANSI.search(out)
    # Terminal: each moment's total, in KiB, as the probe counted it.
    for moment, categories in probe["FULL_SHARD"]:
        total = sum(categories[k] for k in ("params", "unsharded", "grads", "optim"))
        assert re.search(rf"{re.escape(moment)}\s+│\s+{total / 1024:.1f}\s", out), moment
    # SVG: every bar carries the exact bytes of one (series, moment, category).
    drawn = {
        (r.get("data-series"), r.get("data-moment"), r.get("data-category")): int(r.get("data-bytes"))
        for r in ET.parse(picture).getroot().iter("{http://www.w3.org/2000/svg}rect")
        if r.get("data-bytes") is not None
    }
    expected = {
        (label, moment, category): nbytes
        for label, points in probe.items()
        for moment, by_category in points
        for category, nbytes in by_category.items()
        if category != "buffers"
    }
    assert drawn == expected
    assert "extra_unsharded_bytes: 192240" in out


def test_a_claim_without_a_memory_series_says_so(pool: PoolManager, data_dir) -> None:
    code, out = run(["memory", "03-unshard-reshard", "full-shard-frees-non-roots"], pool)
    assert code == 1 and "records no memory series" in out


def test_an_unknown_claim_lists_the_claims(data_dir) -> None:
    code, out = run(["memory", "03-unshard-reshard", "no-such-claim"])
    assert code == 2 and "memory-over-the-step" in out
