"""Pictures recorded by real runs and drawn by the site: ``pytest readings/`` keeps rank 0's memory series and
flat-parameter layout of each passing claim whose ``views`` declare them (``pictures.json`` in the data
directory), and the page draws exactly those, with no claim run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from checks.models.flat_param_diagram import diagram_lines
from reader.claims.pictures import Pictures
from reader.claims.progress import Progress
from reader.claims.records import record_verdicts
from reader.claims.status import Status
from reader.claims.verdict import ClaimVerdict
from tests.site.conftest import installed_torch
from tests.site.site_support import READINGS, ROOT, build, parse

CLAIMS = "memory-over-the-step or layout-at-4"


def test_a_passing_run_records_its_pictures_and_the_page_draws_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {**os.environ, "FSDP_READINGS_DATA_DIR": str(data)}
    guides = [str(READINGS / "03-unshard-reshard.md"), str(READINGS / "12-flat-parameter.md")]
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *guides, "-k", CLAIMS],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "2 passed" in ran.stdout
    stored = json.loads((data / "pictures.json").read_text())
    torch = installed_torch()
    memory = stored["03-unshard-reshard"]["memory-over-the-step"]
    layout = stored["12-flat-parameter"]["layout-at-4"]
    assert memory["torch"] == layout["torch"] == torch
    assert set(memory) == {"torch", "series"} and set(layout) == {"torch", "layout"}  # only what the views declare

    done = build(tmp_path / "site", data, "03-unshard-reshard", "12-flat-parameter")
    assert done.returncode == 0, done.stdout + done.stderr
    page = parse(tmp_path / "site/guides/03-unshard-reshard.html")
    (figure,) = [f for f in page.find_all("figure", "picture") if f.attrs["id"] == "memory-memory-over-the-step"]
    drawn = [(r.attrs["data-series"], r.attrs["data-moment"], r.attrs["data-category"], int(r.attrs["data-bytes"]))
             for r in figure.find_all("rect") if "data-bytes" in r.attrs]  # fmt: skip
    expected = [(label, moment, k, int(cats.get(k, 0))) for label, points in memory["series"].items()
                for moment, cats in points for k in ("params", "unsharded", "grads", "optim")]  # fmt: skip
    assert drawn == expected and any(b for *_, b in drawn)
    page = parse(tmp_path / "site/guides/12-flat-parameter.html")
    (figure,) = [f for f in page.find_all("figure", "picture") if f.attrs["id"] == "layout-layout-at-4"]
    rows = [t.all_text for t in figure.find_all("text")]
    assert rows[1:] == diagram_lines(layout["layout"], width=100)


def test_a_failed_or_undeclared_run_records_no_picture(tmp_path: Path) -> None:
    claim = SimpleNamespace(id="c", views=("memory",))  # what recording reads of a claim
    drawn = {"series": {"a": [("m", {"params": 1})]}}
    broke = ClaimVerdict(Status.FAILED, None, "it broke", "some-reason", "it broke", measured=drawn)
    scores, kept = Progress(tmp_path / "progress.json"), Pictures(tmp_path / "kept.json")
    assert not record_verdicts([("g", claim, broke)], "2.13.0", scores, kept)  # type: ignore[list-item]
    assert kept.of("g", "c", "2.13.0") == {} and scores.claims("g") == {"c": "failed"}
    held = ClaimVerdict(Status.PASSED, None, measured=drawn)
    assert record_verdicts([("g", claim, held)], "2.13.0", scores, kept)  # type: ignore[list-item]
    pictures = Pictures(tmp_path / "pictures.json")
    assert not pictures.record("g", "c", ("timeline",), {"series": {"a": [("m", {"params": 1})]}}, "2.13.0")
    assert not pictures.record("g", "c", ("memory",), {"layout": {"x": 1}}, "2.13.0")  # it declares memory only
    assert pictures.record("g", "c", ("memory",), {"series": {"a": [("m", {"params": 1})]}}, "2.13.0")
    assert pictures.of("g", "c", "2.15.0") == {}  # recorded on another torch: not this one's picture


def test_a_view_run_records_its_picture_too(tmp_path: Path) -> None:
    """``fsdp-readings layout`` runs the claim through the study runner, which keeps the picture as pytest does."""
    data = tmp_path / "data"
    env = {**os.environ, "FSDP_READINGS_DATA_DIR": str(data), "COLUMNS": "120"}
    ran = subprocess.run([sys.executable, "-m", "reader", "--readings", str(READINGS), "layout", "12-flat-parameter",
                          "layout-at-4"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
                         check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    stored = Pictures(data / "pictures.json").of("12-flat-parameter", "layout-at-4", installed_torch())
    assert set(stored) == {"layout"}
    assert diagram_lines(stored["layout"], width=100)[0] in ran.stdout  # what the view drew is what it kept
