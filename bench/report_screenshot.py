"""The README's screenshot of ``slea report``: a report opened in headless Chromium, saved as a PNG.

    .venv/bin/python bench/report_screenshot.py                       # a tiny SLEA-RL run (seconds), its report
    .venv/bin/python bench/report_screenshot.py --run runs/mine --out /tmp/mine.png

Without ``--run`` it trains the tiny random model of the tests (``slea.testing.tiny_run``: Sokoban, 4 iterations)
into a temporary folder, so the page shows every part (curves, evaluations, library, recorded episodes) but
the numbers are a random model's. Needs chromium, chromium-driver (apt; ``make setup`` installs them) and selenium
(the ``dev`` extra). The episode viewer shows the second step of an episode that retrieved experiences.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def screenshot(page: Path, out: Path, episode: int | None = None, width: int = 1400, height: int = 2400) -> Path:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    opts = Options()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--window-size={width},{height}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        driver.get(page.resolve().as_uri())
        if episode is not None:
            Select(driver.find_element(By.CSS_SELECTOR, "#ep-select")).select_by_value(str(episode))
        for b in driver.find_elements(By.CSS_SELECTOR, "#ep-next"):
            if b.is_enabled():
                b.click()
        driver.execute_script("document.querySelector('header').style.position = 'static'; window.scrollTo(0, 0)")
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
    return out


def showcase(run: Path) -> int | None:
    """The recorded episode to show: the first one of several steps that retrieved experiences, else the first
    of several steps."""
    from slea.runs.episodes import read_episodes
    from slea.runs.folder import RunFolder

    eps = read_episodes(RunFolder(run).episodes)
    long = [i for i, e in enumerate(eps) if len(e.get("steps", [])) > 1]
    used = [i for i in long if any(st.get("experiences") for st in eps[i]["steps"])]
    return (used or long or [None])[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="a run folder (default: train the tiny run into a temporary folder)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "report.png")
    ap.add_argument("--height", type=int, default=2400)
    args = ap.parse_args(argv)
    from slea.evaluation.html_report import write_report

    with tempfile.TemporaryDirectory(prefix="slea-report-") as tmp:
        run = args.run
        if run is None:
            from slea.progress import setup_logging
            from slea.testing.tiny_run import tiny_slea_run

            setup_logging()
            run = tiny_slea_run(Path(tmp) / "tiny-slea", iterations=4)
        page = write_report(run, Path(tmp) / "report.html")
        print(f"wrote {screenshot(page, args.out, showcase(run), height=args.height)}")


if __name__ == "__main__":
    sys.exit(main())
