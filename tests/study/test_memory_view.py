"""``fsdp-readings memory``: the picture's numbers are the probe's, in the terminal and in the SVG."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest
from reader.format.parse import load_guide
from tests.study.test_commands import ANSI, READINGS, run

CLAIM = "memory-over-the-step"
CHECK = "checks.guides.g03_unshard_reshard:memory_over_the_step"


def test_the_picture_draws_the_probes_numbers(pool: PoolManager, data_dir, tmp_path: Path) -> None:
    claim = load_guide(READINGS / "03-unshard-reshard.md").claim(CLAIM)  # the figures the check holds
    probe = pool.run(CheckRequest(CHECK, kwargs=claim.kwargs)).values()[0]["series"]
    picture = tmp_path / "memory.svg"
    code, out = run(["memory", "03-unshard-reshard", CLAIM, "--svg", str(picture)], pool, width=80)
    assert code == 0, out
    assert max(len(line) for line in out.splitlines()) <= 80 and not ANSI.search(out)
    # Terminal: each moment's total, in bytes, as the probe counted it; each series' peak; the scale.
    categories_drawn = ("params", "unsharded", "grads", "optim")
    for label, points in probe.items():
        totals = [(moment, sum(c[k] for k in categories_drawn)) for moment, c in points]
        for moment, total in totals:
            assert re.search(rf"^{re.escape(moment)}\s+{total:,} B\s", out, re.M), (label, moment)
        peak_moment, peak = max(totals, key=lambda t: t[1])
        assert f"peak {peak:,} B at {peak_moment}" in out
    largest = max(sum(c[k] for k in categories_drawn) for points in probe.values() for _, c in points)
    assert f"scale: the longest bar is {largest:,} B" in out
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
    assert "extra_unsharded_bytes: 192,240" in out and "all_gathers: FULL_SHARD 7 · SHARD_GRAD_OP 4" in out
    root = ET.parse(picture).getroot()
    texts = list(root.iter("{http://www.w3.org/2000/svg}text"))
    totals = {int(x.get("data-total")) for x in texts if x.get("data-total")}
    assert totals == {sum(c[k] for k in categories_drawn) for points in probe.values() for _, c in points}
    ticks = [int(x.get("data-tick")) for x in texts if x.get("data-tick") is not None]
    assert ticks[0] == 0 and ticks[-1] == largest and len(ticks) == 5  # an axis in bytes
    ground = next(root.iter("{http://www.w3.org/2000/svg}rect"))
    assert ground.get("fill") == "#ffffff" and ground.get("width") == root.get("width")  # opaque as a PNG


def test_without_colour_each_category_has_a_glyph_of_its_own() -> None:
    from rich.console import Console

    from reader.views.memory import GLYPHS, picture

    series = {"s": [("m", {"params": 100, "unsharded": 100, "grads": 100, "optim": 100})]}
    console = Console(record=True, width=80, color_system=None, force_terminal=False)
    console.print(picture(series, "t"))
    bar = next(line for line in console.export_text().splitlines() if line.startswith("m "))
    assert [g for g in GLYPHS.values() if g in bar] == list(GLYPHS.values())  # four glyphs, in category order
    assert len(set(GLYPHS.values())) == 4


def test_a_claim_without_a_memory_series_is_refused_at_once_with_the_claims_that_have_one(data_dir) -> None:
    """Refused before anything runs (no pool is given: a run would start one), naming the claims to try."""
    code, out = run(["memory", "03-unshard-reshard", "full-shard-frees-non-roots"])
    flat = " ".join(out.split())
    assert code == 2 and "full-shard-frees-non-roots has no memory to draw" in flat
    assert "the claims of 03-unshard-reshard it can draw: memory-over-the-step" in flat


def test_an_unknown_claim_lists_the_claims(data_dir) -> None:
    code, out = run(["memory", "03-unshard-reshard", "no-such-claim"])
    assert code == 2 and "memory-over-the-step" in out
