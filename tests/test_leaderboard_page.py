"""The leaderboard page in a real browser: headless Chromium driven through Selenium.

Every table sorts on a header click (▲/▼ shown, pinned rows unmoved), headers are reachable with
Tab and sort with Enter, the console stays free of errors, and on a 400 px phone the page keeps
its width while tables scroll sideways and intervals never wrap. Skips, saying why, where Chromium
or its driver is not installed (Debian: ``apt-get install chromium chromium-driver``).
"""

from __future__ import annotations

import resource
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from lengthgen.harness.storage.results import write_parquet_atomic
from lengthgen.leaderboard import write_leaderboard
from lengthgen.leaderboard.budget_page import StudySource
from tests.leaderboard_rows import ROWS, copy_study_rows, make_rows, planned_recipe, study_rows

webdriver = pytest.importorskip("selenium.webdriver", reason="no selenium: pip install selenium")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

BROWSER = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    BROWSER is None or DRIVER is None,
    reason="no headless browser: install Chromium and its driver (apt-get install chromium chromium-driver)",
)

#: Flags for a sandbox-less container with no network and no GPU.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage")


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A board with two tasks, two learning rates for softmax (so a runner-up), paper rows (copy)."""
    root = tmp_path_factory.mktemp("board")
    val = {key: (0.9 + 0.01 * key[1], 0.5) for key in ROWS}
    other = make_rows({("softmax", 0): [0.8, 0.2], ("softmax", 1): [0.7, 0.1]}, lr=5e-4,
                      val={("softmax", 0): (0.5, 0.1), ("softmax", 1): (0.6, 0.1)})
    flip = make_rows({("softmax", 0): [1.0, 0.95, 0.9], ("entmax", 0): [0.9, 0.5, 0.1]}, task="flip_flop")
    rows = pd.concat([make_rows(ROWS, val=val), other, flip], ignore_index=True)
    scores = {(attn, steps, seed): {8: 0.97, 256: 0.3 + 0.2 * k + 0.02 * seed, 1024: 0.05 + 0.2 * k}
              for attn in ("asentmax", "softmax") for k, steps in enumerate((3000, 12000, 48000))
              for seed in range(3)}
    copy_runs = {(attn, steps, seed): {8: 0.9, 16: 0.3 + 0.1 * k + 0.05 * seed, 32: 0.05 * k}
                 for attn in ("asentmax", "softmax") for k, steps in enumerate((4000, 8000))
                 for seed in range(3)}
    study = StudySource(pd.concat([study_rows(scores), copy_study_rows(copy_runs)], ignore_index=True),
                        {"mqmtar": 33, "copy": 6}, "leaderboard/budget.toml", "leaderboard/budget",
                        frozenset({planned_recipe("asentmax", 2e-3), planned_recipe("softmax", 2e-3)}))
    write_leaderboard(rows, root, source=str(root), commit="abc1234", budget=study)
    return (root / "leaderboard.html").as_uri()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(BROWSER)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
        pytest.skip("Chromium cannot start under a virtual-memory limit (ulimit -v); run without one")
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def load(driver: Any, url: str, width: int) -> None:
    driver.set_window_size(width, 900)
    driver.get(url)
    console_errors(driver)  # drain anything logged before this page


def column(table: Any, index: int, pinned: bool = False) -> list[str]:
    body = table.find_elements(By.CSS_SELECTOR, "tbody.pinned" if pinned else "tbody:not(.pinned)")
    return [row.find_elements(By.TAG_NAME, "td")[index].get_attribute("data-v") or ""
            for row in body[0].find_elements(By.TAG_NAME, "tr")] if body else []


def texts(driver: Any, table: Any, index: int) -> list[str]:
    """A column's cells as the page's sort reads them (their text content), rows in page order."""
    return driver.execute_script(
        "return Array.from(arguments[0].querySelectorAll('tbody:not(.pinned) tr'))"
        ".map(r => r.cells[arguments[1]].textContent);", table, index)


def in_order(driver: Any, cells: list[str]) -> bool:
    """Ascending by the browser's own collation (``localeCompare``, which the page sorts by)."""
    return driver.execute_script(
        "var c = arguments[0]; return c.slice(1).every((x, i) => c[i].localeCompare(x) <= 0);", cells)


def pinned_text(table: Any) -> str:
    return "\n".join(t.text for t in table.find_elements(By.CSS_SELECTOR, "tbody.pinned"))


def sortable_column(table: Any) -> int:
    """A column whose values differ between rows, so a sort shows: a numeric one if there is one,
    else one of text."""
    heads = table.find_elements(By.CSS_SELECTOR, "thead th")
    for index, head in enumerate(heads):
        values = column(table, index)
        if head.get_attribute("data-numeric") == "1" and all(values) and len(set(values)) > 1:
            return index
    cells = table.find_elements(By.CSS_SELECTOR, "tbody:not(.pinned) tr")
    for index in range(len(heads)):
        if len({row.find_elements(By.TAG_NAME, "td")[index].text for row in cells}) > 1:
            return index
    return 0


def test_console_check_catches_errors(browser: Any) -> None:
    """The console check below can fail: a page that throws is caught."""
    browser.get("data:text/html,<script>undefined.dataset</script>")
    assert any("TypeError" in message for message in console_errors(browser))


def test_every_table_sorts_on_click_with_indicator(browser: Any, page_url: str) -> None:
    load(browser, page_url, 1400)
    tables = browser.find_elements(By.CSS_SELECTOR, "table.sortable")
    # effective length; copy, its settings and its paper-vs-ours; flip_flop and its settings; the budget
    # study and its copy part; how the runs were made; the commits that made the rows
    assert len(tables) == 10
    text_columns = 0
    for table in tables:
        col = sortable_column(table)
        head = table.find_elements(By.CSS_SELECTOR, "thead th")[col]
        pinned_before = pinned_text(table)
        numeric = head.get_attribute("data-numeric") == "1"
        head.find_element(By.TAG_NAME, "button").click()
        values = column(table, col)
        if numeric:
            numbers = [float(v) for v in values]
            assert numbers == sorted(numbers, reverse=True), (head.text, numbers)
            assert head.get_attribute("aria-sort") == "descending" and "▼" in head.text
        else:
            cells = texts(browser, table, col)
            text_columns += len(set(cells)) > 1  # a table of one distinct value shows no order
            assert in_order(browser, cells), cells
            assert head.get_attribute("aria-sort") == "ascending" and "▲" in head.text, cells
        head.find_element(By.TAG_NAME, "button").click()
        assert head.get_attribute("aria-sort") == ("ascending" if numeric else "descending")
        if numeric:
            numbers = [float(v) for v in column(table, col)]
            assert numbers == sorted(numbers) and "▲" in head.text
        else:
            cells = texts(browser, table, col)
            assert in_order(browser, cells[::-1]) and "▼" in head.text, cells
        others = [h for i, h in enumerate(table.find_elements(By.CSS_SELECTOR, "thead th")) if i != col]
        assert all(h.get_attribute("aria-sort") == "none" for h in others)
        assert pinned_text(table) == pinned_before  # the paper and protocol rows never move
    assert text_columns  # the text branch ran on a table whose order shows
    assert console_errors(browser) == []


def test_headers_are_reachable_and_sort_by_keyboard(browser: Any, page_url: str) -> None:
    load(browser, page_url, 1400)
    table = browser.find_elements(By.CSS_SELECTOR, "table.sortable")[1]  # the first task's table
    col = sortable_column(table)
    target = table.find_elements(By.CSS_SELECTOR, "thead th button")[col]
    body = browser.find_element(By.TAG_NAME, "body")
    body.click()
    for _ in range(200):  # Tab through links, scroll regions and header buttons until the target
        browser.switch_to.active_element.send_keys(Keys.TAB)
        if browser.switch_to.active_element == target:
            break
    else:
        pytest.fail("the header button is not reachable with Tab")
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    head = table.find_elements(By.CSS_SELECTOR, "thead th")[col]
    numbers = [float(v) for v in column(table, col)]
    assert head.get_attribute("aria-sort") == "descending" and numbers == sorted(numbers, reverse=True)
    browser.switch_to.active_element.send_keys(Keys.SPACE)
    assert head.get_attribute("aria-sort") == "ascending"
    assert console_errors(browser) == []


def test_tooltips_links_and_date(browser: Any, page_url: str) -> None:
    load(browser, page_url, 1400)
    heads = browser.find_elements(By.CSS_SELECTOR, "table.sortable thead th")
    task_heads = [h for h in heads if h.text.strip() in ("learned", "setting", "runner-up", "eff. length")]
    assert task_heads and all(h.get_attribute("title") for h in task_heads)
    browser.find_element(By.CSS_SELECTOR, "details#how > summary").click()  # "How to read" is folded
    abbr = browser.find_element(By.TAG_NAME, "abbr")
    assert abbr.text == "mean [lo, hi]" and "Student t" in abbr.get_attribute("title")
    links = {a.text: a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "p.meta a")}
    assert set(links) == {"CSV", "README", "data"} and links["CSV"].endswith("/leaderboard.csv")
    assert links["data"] == page_url.rsplit("/", 1)[0] + "/"  # the rows' folder: here the board's own
    meta = browser.find_element(By.CSS_SELECTOR, "p.meta").text
    assert "Data as of 2026-01-03 00:00 UTC" in meta and "data commit abc1234" in meta
    interval = browser.find_element(By.CSS_SELECTOR, "td.n[title*='Student-t']")
    assert "s0" in interval.get_attribute("title")  # per-seed values on hover


def test_phone_layout(browser: Any, page_url: str) -> None:
    load(browser, page_url, 400)
    width = browser.execute_script("return window.innerWidth")
    assert width <= 400  # the viewport tag: no 980 px desktop layout scaled down
    page_width = browser.execute_script("return document.documentElement.scrollWidth")
    assert page_width <= width  # the page itself never scrolls sideways ...
    scrolls = browser.execute_script(
        "return Array.from(document.querySelectorAll('.scroll')).map(e => e.scrollWidth > e.clientWidth)")
    assert any(scrolls)  # ... wide tables scroll inside their box
    font = browser.execute_script(
        "return parseFloat(getComputedStyle(document.querySelector('td')).fontSize)")
    assert font >= 11
    wrapped = browser.execute_script(
        "return Array.from(document.querySelectorAll('.ci:not(.w)')).filter(e => e.getClientRects().length "
        "&& (e.getClientRects().length !== 1 "
        "|| e.getBoundingClientRect().height > 1.6 * parseFloat(getComputedStyle(e).fontSize))).length")
    assert wrapped == 0  # no interval breaks across lines (lists of per-seed values may)
    pre = browser.execute_script(
        "var p = document.querySelector('pre'); return [getComputedStyle(p).overflowX, "
        "p.scrollWidth > p.clientWidth, p.getBoundingClientRect().right <= window.innerWidth + 1]")
    assert pre == ["auto", True, True]  # the commands scroll inside their box
    assert console_errors(browser) == []


def test_desktop_layout(browser: Any, page_url: str) -> None:
    load(browser, page_url, 1400)
    pre_fits = browser.execute_script(
        "var p = document.querySelector('pre'); return p.getBoundingClientRect().right <= window.innerWidth")
    assert pre_fits
    figures = browser.execute_script(
        "return Array.from(document.images).map(i => i.complete && i.naturalWidth > 0)")
    assert figures and all(figures)  # every inline SVG figure decodes
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")


#: The texts of the first screen's elements that lie inside the viewport, and whether they have digits.
FIRST_SCREEN = """
var out = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
while (walker.nextNode()) {
  var node = walker.currentNode, range = document.createRange();
  range.selectNodeContents(node);
  var rects = Array.from(range.getClientRects()).filter(r => r.width > 0 && r.height > 0
    && r.top >= 0 && r.bottom <= window.innerHeight && r.left >= 0 && r.right <= window.innerWidth);
  if (rects.length && node.textContent.trim()) { out.push(node.textContent.trim()); }
}
return out;"""


@pytest.mark.parametrize("width", [1280, 400])
def test_the_first_screen_answers(browser: Any, page_url: str, width: int) -> None:
    """At a laptop's 1280 px and a phone's 400 px: the page never scrolls sideways, the first screen
    shows a sentence per task with numbers, "How to read" waits folded, and at 1280 px the headline
    matrix is in view whole and no table hides a column behind a sideways scroll."""
    browser.set_window_size(width, 900)
    browser.get(page_url)
    inner = browser.execute_script("return [window.innerWidth, window.innerHeight]")
    browser.set_window_size(2 * width - inner[0], 2 * 900 - inner[1])  # the viewport itself: width × 900
    browser.get(page_url)
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    visible = browser.execute_script(FIRST_SCREEN)
    verdicts = [t for t in visible if t.startswith(("copy:", "flip_flop:"))]
    assert verdicts and any(ch.isdigit() for t in verdicts for ch in t), visible
    assert not browser.find_element(By.CSS_SELECTOR, "details#how").get_attribute("open")
    if width == 1280:
        matrix = browser.execute_script(
            "var r = document.querySelector('table.headline').getBoundingClientRect();"
            "return [r.left >= 0, r.right <= window.innerWidth, r.top >= 0, r.bottom <= window.innerHeight]")
        assert matrix == [True, True, True, True]
        cells = [t for t in visible if t.endswith("×") and any(ch.isdigit() for ch in t)]
        assert cells  # the matrix's effective lengths are read on the first screen
        hidden = browser.execute_script(
            "return Array.from(document.querySelectorAll('.scroll, .hm-wrap'))"
            ".filter(b => b.scrollWidth > b.clientWidth + 1).map(b => b.getAttribute('aria-label'))")
        assert hidden == []
    assert console_errors(browser) == []


def test_the_budget_section_shows_its_table_trend_and_figures(browser: Any, page_url: str) -> None:
    load(browser, page_url, 1280)
    section = browser.execute_script(
        "var h = document.getElementById('budget'), out = {tables: 0, figures: 0, trends: []};"
        "for (var e = h.nextElementSibling; e && e.tagName !== 'H2'; e = e.nextElementSibling) {"
        "  out.tables += e.querySelectorAll('table').length;"
        "  e.querySelectorAll('img').forEach(function (i) {"
        "    if (i.complete && i.naturalWidth > 0) out.figures++; });"
        "  if (e.tagName === 'UL') e.querySelectorAll('li').forEach(function (l) {"
        "    out.trends.push(l.textContent); });"
        "} return out;")
    assert section["tables"] == 2 and section["figures"] == 3  # MQMTAR: 1 and 2; its copy part: 1 and 1
    trends, copy = section["trends"][:2], section["trends"][2:]
    assert all("reaches 95% at about" in t for t in trends)
    assert copy == ["asentmax: 35.0% at 4,000 steps (3 seeds) → 45.0% at 8,000 steps (3 seeds)",
                    "softmax: 35.0% at 4,000 steps (3 seeds) → 45.0% at 8,000 steps (3 seeds)"]
    assert console_errors(browser) == []


def test_page_written_next_to_data_links_it(tmp_path: Path) -> None:
    """The page's data link points at the data it was built from (no browser needed)."""
    rows = make_rows(ROWS)
    write_leaderboard(rows, tmp_path / "out", source=str(tmp_path), commit="x")
    assert 'href="../"' in (tmp_path / "out" / "leaderboard.html").read_text()


# -- result folders are untrusted: hostile strings stay text --------------------------------------
ALERT_ATTN = "<script>alert(1)</script>"
ALERT_POS = 'x" onmouseover="alert(2)" data-x="'


@pytest.fixture(scope="module")
def hostile_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A board whose every data string (task, backend, scheme, preset, ablation folder, ABOUT.md,
    --title, --hardware) tries to run script."""
    from tests.hostile import SCRIPT, relabel

    root = tmp_path_factory.mktemp("hostile")
    rows = relabel(make_rows(ROWS), task=SCRIPT, attn=ALERT_ATTN, pos=ALERT_POS, preset=SCRIPT)
    ablation = root / "abl" / 'a"><img src=x onerror="window.pwned=3">'  # a folder name: no slash
    write_parquet_atomic(relabel(make_rows({("softmax", 0): [1.0, 0.5]}), attn=SCRIPT),
                         ablation / "data" / "rows.parquet")
    (ablation / "ABOUT.md").write_text(f"# {SCRIPT}\n\n**{ALERT_ATTN}** and `{SCRIPT}`.\n", encoding="utf-8")
    write_leaderboard(rows, root / "out", source=str(root), commit="abc1234", title=SCRIPT,
                      hardware=ALERT_ATTN, ablations=root / "abl")
    return (root / "out" / "leaderboard.html").as_uri()


def test_hostile_strings_are_shown_as_text_and_never_run(browser: Any, hostile_url: str) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    from lengthgen.leaderboard.safe import slug
    from tests.hostile import SCRIPT

    load(browser, hostile_url, 1400)
    for element in browser.find_elements(By.CSS_SELECTOR, "td, th, h1, h2, h3, nav a, p, li"):
        browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}))",
                               element)
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018
    assert browser.execute_script("return typeof window.pwned") == "undefined"
    assert browser.execute_script("return document.scripts.length") == 1  # the page's own sorting script
    assert browser.execute_script(
        "return Array.from(document.images).every(i => i.src.startsWith('data:image/svg+xml'))")
    assert browser.execute_script("return document.querySelectorAll('[onmouseover], [onerror]').length") == 0
    # shown literally where the page names them
    assert browser.find_element(By.TAG_NAME, "h1").text == SCRIPT
    (link,) = browser.find_elements(By.CSS_SELECTOR, "nav a")
    assert link.text == SCRIPT and link.get_attribute("href").endswith(f"#task-{slug(SCRIPT)}")
    section = browser.find_element(By.ID, f"task-{slug(SCRIPT)}")
    assert section.find_element(By.TAG_NAME, "h2").text == SCRIPT
    cells = [td.text for td in section.find_elements(By.CSS_SELECTOR, "tbody:not(.pinned) td")]
    assert ALERT_ATTN in cells and ALERT_POS in cells
    assert any(h3.text == SCRIPT for h3 in browser.find_elements(By.TAG_NAME, "h3"))
    assert console_errors(browser) == []
