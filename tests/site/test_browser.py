"""The site as a reader sees it, in headless Chromium (Debian's ``chromium`` and ``chromium-driver``): screenshots
of the index and guides 06 and 12 at a desktop and a phone width, and what they show measured from the same
rendered page: each note beside the lines it pins on a desktop (right of the code, level with those lines), below
them on a phone, nothing wider than a phone's screen, answers closed until opened, search that finds."""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.site.conftest import BuiltSite
from tests.site.site_support import unavailable

DESKTOP, PHONE = (1280, 900), (390, 844)
PAGES = ("index.html", "guides/06-backward-prefetch.html", "guides/12-flat-parameter.html")
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")

# Per note beside code: the note's box, its code's box, and the lines from the first it pins to the last of its
# segment (the note is shown under that one), all in page coordinates.
NOTE_BOXES = """
const page = (r) => ({left: r.left + scrollX, right: r.right + scrollX, top: r.top + scrollY,
                      bottom: r.bottom + scrollY});
return [...document.querySelectorAll('.segment')].flatMap((segment) => {
  const code = segment.querySelector('pre.code');
  const lines = segment.querySelectorAll('.line');
  return [...segment.querySelectorAll('.note')].map((note) => {
    const first = document.getElementById(note.querySelector('a.label').getAttribute('href').slice(1));
    return {id: note.id, note: page(note.getBoundingClientRect()), code: page(code.getBoundingClientRect()),
            first: page(first.getBoundingClientRect()), last: page(lines[lines.length - 1].getBoundingClientRect())};
  });
});
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from selenium import webdriver
    except ImportError:
        unavailable("selenium is not installed: pip install -e '.[dev]'")
    if CHROMIUM is None or DRIVER is None:
        unavailable("headless Chromium is not installed: apt-get install chromium chromium-driver")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()  # the browser and its driver: no process outlives the module


def _open(browser: Any, root: Path, page: str, size: tuple[int, int]) -> None:
    browser.set_window_size(*size)
    browser.get((root / page).as_uri())
    width = browser.execute_script("return window.innerWidth")
    if width != size[0]:  # the window includes its frame: make the viewport the width asked for
        browser.set_window_size(size[0] + size[0] - width, size[1])


def _screenshot(browser: Any, folder: Path, name: str) -> tuple[int, int]:
    path = folder / f"{name}.png"
    assert browser.save_screenshot(str(path))
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def _too_wide(browser: Any, root: Path, page: str) -> list[str]:
    _open(browser, root, page, PHONE)
    wide, inner = browser.execute_script("return [document.scrollingElement.scrollWidth, window.innerWidth]")
    assert inner == PHONE[0]
    return [f"{page} scrolls sideways: {wide} px wide in a {inner} px screen"] if wide > inner else []


def _not_beside(browser: Any, root: Path, page: str) -> list[str]:
    _open(browser, root, page, DESKTOP)
    boxes = browser.execute_script(NOTE_BOXES)
    assert len(boxes) > 5
    problems = []
    for box in boxes:
        note, code = box["note"], box["code"]
        if note["left"] < code["right"]:
            problems.append(f"{box['id']} is not right of its code")
        if not (note["top"] < box["last"]["bottom"] and note["bottom"] > box["first"]["top"]):
            problems.append(
                f"{box['id']} is not level with its lines: note {note['top']:.0f}-{note['bottom']:.0f}, lines "
                f"{box['first']['top']:.0f}-{box['last']['bottom']:.0f}"
            )
    return problems


@pytest.mark.parametrize("page", PAGES)
def test_nothing_is_wider_than_a_phone_screen(browser: Any, site: BuiltSite, page: str, tmp_path: Path) -> None:
    assert _too_wide(browser, site.out, page) == []
    assert _screenshot(browser, tmp_path, "phone")[0] == PHONE[0]


@pytest.mark.parametrize("page", PAGES[1:])
def test_on_a_desktop_each_note_is_beside_the_lines_it_pins(
    browser: Any, site: BuiltSite, page: str, tmp_path: Path
) -> None:
    assert _not_beside(browser, site.out, page) == []
    browser.execute_script("document.querySelector('.segment .note').scrollIntoView({block: 'center'})")
    assert _screenshot(browser, tmp_path, "desktop")[0] == DESKTOP[0]


@pytest.mark.parametrize(
    ("change", "measure"),
    [(("@media (min-width: 64rem)", "@media (min-width: 640rem)"), _not_beside),  # notes stacked on a desktop
     (("pre { margin: 0; overflow-x: auto;", "pre { margin: 0;"), _too_wide)],  # code widens the page
)  # fmt: skip
def test_the_measures_fail_on_a_stylesheet_that_breaks_the_layout(
    browser: Any, site: BuiltSite, tmp_path: Path, change: tuple[str, str], measure: Any
) -> None:
    rule, broken = change
    copy = tmp_path / "site"
    shutil.copytree(site.out, copy)
    css = copy / "assets/site.css"
    assert rule in css.read_text()
    css.write_text(css.read_text().replace(rule, broken))
    assert measure(browser, copy, PAGES[1])


@pytest.mark.parametrize("page", PAGES[1:])
def test_on_a_phone_each_note_is_below_its_code(browser: Any, site: BuiltSite, page: str) -> None:
    _open(browser, site.out, page, PHONE)
    boxes = browser.execute_script(NOTE_BOXES)
    assert boxes and all(box["note"]["top"] >= box["code"]["bottom"] for box in boxes)


def test_an_answer_stays_closed_until_its_disclosure_is_opened(browser: Any, site: BuiltSite) -> None:
    _open(browser, site.out, PAGES[1], DESKTOP)
    details = browser.find_element("css selector", ".predict details")
    answer = details.find_element("css selector", "p")
    assert not answer.is_displayed()
    details.find_element("css selector", "summary").click()
    assert answer.is_displayed()


def test_search_finds_a_symbol_and_links_to_where_it_is_read(browser: Any, site: BuiltSite) -> None:
    _open(browser, site.out, "index.html", DESKTOP)
    assert not browser.find_element("id", "results").is_displayed()
    browser.find_element("id", "q").send_keys("_prefetch_handle")
    links = browser.find_elements("css selector", "#results a")
    hrefs = [link.get_attribute("href") for link in links]
    assert any("06-backward-prefetch.html#source-" in h for h in hrefs), hrefs
    links[0].click()
    assert browser.current_url.split("#")[0].endswith(".html")
