"""The board's first screen as a reader sees it: screenshots at 1280 px (a laptop) and 400 px (a
phone), taken in headless Chromium, and a report of every table wider than its box.

    python docs/screenshots.py [--page leaderboard/leaderboard.html] [--out docs]

Writes ``board-1280.png`` and ``board-400.png`` under ``--out`` (the README links them) and prints,
per width, the page's height and the tables that scroll sideways. Needs Debian's ``chromium`` and
``chromium-driver`` and the ``selenium`` package (the test extras).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

#: (width, height) of the two screens: a laptop's browser window and a phone's.
SCREENS = ((1280, 900), (400, 860))
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--force-device-scale-factor=1")

#: For each scrolling box of the page: its label, its width and the width of what it holds.
OVERFLOW_SCRIPT = """
return Array.from(document.querySelectorAll('.scroll, .hm-wrap')).map(function (box) {
  return [box.getAttribute('aria-label') || '', box.clientWidth, box.scrollWidth];
});"""


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    names = ("chromium", "chromium-browser", "google-chrome")
    binary = next((p for p in map(shutil.which, names) if p), None)
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        raise SystemExit("needs Chromium and its driver: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='lengthgen-chromium-')}")
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)


def overflowing(driver: Any) -> list[tuple[str, int, int]]:
    """(label, box width, content width) of every table box whose content is wider than the box."""
    return [(label, int(box), int(content)) for label, box, content in driver.execute_script(OVERFLOW_SCRIPT)
            if content > box + 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", type=Path, default=Path("leaderboard/leaderboard.html"))
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    driver = browser()
    try:
        for width, height in SCREENS:
            driver.set_window_size(width, height)
            driver.get(args.page.resolve().as_uri())
            inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
            # the window's frame takes some of its size: make the viewport itself width × height
            driver.set_window_size(2 * width - inner[0], 2 * height - inner[1])
            driver.get(args.page.resolve().as_uri())
            target = args.out / f"board-{width}.png"
            if not driver.save_screenshot(str(target)):  # selenium returns False, it does not raise
                raise SystemExit(f"could not write {target}")
            tall = driver.execute_script("return document.documentElement.scrollHeight")
            wide = overflowing(driver)
            print(f"{width} px: {target} ({tall} px tall); {len(wide)} table boxes scroll sideways")
            for label, box, content in wide:
                print(f"  {label}: {content} px in {box} px")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
