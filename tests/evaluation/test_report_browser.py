"""slea report in a real headless Chromium (Selenium): a report built from a tiny SLEA-RL run loads without console
errors, draws its curves and tables, its library browser filters and its episode viewer steps; the screenshot is
kept (``$SLEA_TEST_ARTIFACTS/report.png`` when that variable names a folder, else the test's tmp dir).

Chromium and its driver come from the system package manager (the Makefile's set-up installs ``chromium`` and
``chromium-driver`` through apt); without them, or without selenium (the ``dev`` extra), the test skips."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("SLEA_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SLEA_CHROMEDRIVER", "/usr/bin/chromedriver")


def _browser():
    """A headless Chromium driven by Selenium, or a skip that says what is missing."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install 'slea[dev]')")
    for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).is_file():
            pytest.skip(f"no {path}: install the Debian package {pkg} (make setup does, through apt)")
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _artifact_dir(tmp_path: Path) -> Path:
    out = os.environ.get("SLEA_TEST_ARTIFACTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        return Path(out)
    return tmp_path


@pytest.fixture(scope="module")
def driver():
    d = _browser()
    yield d
    d.quit()


def _errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def test_report_of_a_tiny_run_in_headless_chromium(tmp_path, driver):
    try:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys
        from selenium.webdriver.support.ui import Select

        from slea.evaluation.html_report import gather, write_report
        from slea.testing.tiny_run import tiny_slea_run

        run = tiny_slea_run(tmp_path / "run")
        page = write_report(run)
        data = gather(run)
        driver.get(page.resolve().as_uri())
        css = lambda sel: driver.find_elements(By.CSS_SELECTOR, sel)

        def erase(sel: str) -> None:  # as a user does (clear() fires no input event)
            css(sel)[0].send_keys(Keys.CONTROL, "a")
            css(sel)[0].send_keys(Keys.BACKSPACE)

        assert driver.execute_script("return document.body.dataset.ready") == "1"
        errors = _errors(driver)
        assert not errors, errors

        # curves: one SVG line per main metric, with as many points as logged iterations
        paths = css("#curves-main svg path.series")
        assert len(paths) == len(data["curves"]["main"]) + 1  # the main curves + the picked metric
        assert all(p.get_attribute("d").count("L") == len(data["curves"]["x"]) - 1 for p in paths[:3])
        Select(css("#curve-pick")[0]).select_by_value("train/episode_len")
        assert css("#curve-extra figure")[0].get_attribute("data-metric") == "train/episode_len"

        # tables: the evaluation summary lists before and after
        firsts = [r.find_elements(By.TAG_NAME, "td")[0].text for r in css("#eval-tables table")[0]
                  .find_elements(By.CSS_SELECTOR, "tbody tr")]
        assert firsts == ["before", "after"]

        # the library browser: zone and cluster filters change the visible rows
        entries = data["library"]["entries"]
        rows = lambda: css("#lib-rows tr")
        assert len(rows()) == len(entries) >= 2
        zones = {e["zone"] for e in entries}
        assert zones == {"pos", "neg"}
        Select(css("#lib-zone")[0]).select_by_value("neg")
        assert len(rows()) == sum(e["zone"] == "neg" for e in entries) < len(entries)
        assert css("#lib-count")[0].text == f"{len(rows())} of {len(entries)} entries"
        Select(css("#lib-zone")[0]).select_by_value("")
        css("#lib-cluster")[0].send_keys("99999")
        assert rows() == []
        erase("#lib-cluster")
        assert len(rows()) == len(entries)
        css("#lib-text")[0].send_keys(entries[0]["text"][:25])
        assert 1 <= len(rows()) < len(entries)
        erase("#lib-text")
        assert len(rows()) == len(entries)

        # the episode viewer steps through an episode, and the library links into it
        eps = data["episodes"]
        long = next(i for i, e in enumerate(eps) if len(e["steps"]) >= 2)
        Select(css("#ep-select")[0]).select_by_value(str(long))
        assert css("#ep-step-label")[0].text == f"step 1 of {len(eps[long]['steps'])}"
        assert css("#ep-prev")[0].get_attribute("disabled") is not None
        css("#ep-next")[0].click()
        assert css("#ep-step-label")[0].text == f"step 2 of {len(eps[long]['steps'])}"
        assert css("#ep-obs")[0].text == eps[long]["steps"][1]["obs"].strip()
        assert css("#ep-strip tr.current td")[0].text == "2"
        link = css("#lib-rows a.ep")[0]
        target = int(link.get_attribute("data-episode"))
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", link)
        link.click()
        assert css("#ep-select")[0].get_attribute("value") == str(target)
        assert css("#ep-step-label")[0].text.startswith("step 1 of ")

        assert not _errors(driver)
        driver.execute_script("window.scrollTo(0, 0)")
        shot = _artifact_dir(tmp_path) / "report.png"
        assert driver.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        shutil.rmtree(tmp_path / "run", ignore_errors=True)


def test_a_compare_folder_and_a_bare_run_render_without_errors(tmp_path, driver):
    import json

    from selenium.webdriver.common.by import By

    from slea.evaluation.html_report import write_report

    out = tmp_path / "cmp"
    for name in ("grpo-s0", "grpo-s1", "slea-s0"):
        (out / "runs" / name).mkdir(parents=True)
        (out / "runs" / name / "metrics.jsonl").write_text("".join(json.dumps(
            {"iteration": i, "env_steps": 10 * (i + 1), "train/success": 0.1 * i, "train/return": 0.2 * i,
             "train/invalid_rate": 0.5}) + "\n" for i in range(4)))
    stat = {"mean": 0.5, "std": 0.1, "n": 2, "values": [0.4, 0.6]}
    from slea.evaluation.stats import paired_comparison

    pair = paired_comparison({0: 0.6, 1: 0.7}, {0: 0.5, 1: 0.5}, names=("slea", "grpo")).to_dict()
    (out / "table.json").write_text(json.dumps({"budgets": [40], "algorithms": {
        a: {"seeds": [0, 1], "heldout_success": stat, "train_success_at_env_steps": {"40": stat}}
        for a in ("grpo", "slea")}, "baseline": "grpo", "pairs": [pair]}))
    (out / "compare.json").write_text(json.dumps({"config": "c.yaml", "algorithms": ["grpo", "slea"],
                                                  "seeds": [0, 1], "overrides": []}))
    driver.get(write_report(out).resolve().as_uri())
    assert driver.execute_script("return document.body.dataset.ready") == "1" and not _errors(driver)
    charts = driver.find_elements(By.CSS_SELECTOR, "#curves-main figure")
    assert len(charts) == 3
    assert all(len(c.find_elements(By.CSS_SELECTOR, "path.series")) == 3 for c in charts)  # one per sub-run
    cells = [td.text for td in driver.find_elements(By.CSS_SELECTOR, ".comparison tbody tr:first-child td")]
    assert cells[:3] == ["grpo", "0, 1", "0.500 ± 0.100"]
    paired = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#pairs tbody tr:first-child td")]
    assert paired[:4] == ["slea − grpo", "2", "s0 +0.100, s1 +0.200", "+0.150 ± 0.071"]  # the pairs of table.md
    assert paired[4] == "0.500" and paired[-1] == "not separated"

    bare = tmp_path / "bare"  # no library, no episodes, no evaluations: the page says so
    bare.mkdir()
    (bare / "config.yaml").write_text("algorithm: {name: grpo}\n")
    driver.get(write_report(bare).resolve().as_uri())
    assert driver.execute_script("return document.body.dataset.ready") == "1" and not _errors(driver)
    texts = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".empty")]
    assert any("no library.sqlite" in t for t in texts) and any("no episodes.jsonl" in t for t in texts)


def test_charts_tick_iterations_as_integers_and_never_repeat_a_label(tmp_path, driver):
    """A two-iteration run: the x ticks are 1 and 2 (no 1.2 ... 1.8; iterations counted from 1, as the log lines
    count them), and a metric that barely moves
    (time/iteration_s 0.181 → 0.183) gets y labels that differ; the training-signals charts are drawn."""
    import json

    from selenium.webdriver.common.by import By

    from slea.evaluation.html_report import write_report

    run = tmp_path / "two"
    run.mkdir()
    rows = [{"iteration": i, "train/success": 0.25 * i, "time/iteration_s": 0.181 + 0.002 * i,
             "response/length_mean": 5.0 + i, "response/length_max": 6.0, "update/clip_frac": 0.1,
             "update/approx_kl": 2e-4 * i, "update/lr": 3e-4, "time/rollout_s": 0.1, "time/train_s": 0.05}
            for i in range(2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    driver.get(write_report(run).resolve().as_uri())
    assert driver.execute_script("return document.body.dataset.ready") == "1" and not _errors(driver)
    figs = driver.find_elements(By.CSS_SELECTOR, "figure.chart")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#curves-watch figure")) == 5  # length, clip, KL, lr, seconds
    for fig in figs:
        xs = [t.text for t in fig.find_elements(By.CSS_SELECTOR, "text.xtick")]
        ys = [t.text for t in fig.find_elements(By.CSS_SELECTOR, "text.ytick")]
        assert xs == ["1", "2"], (fig.get_attribute("data-metric"), xs)
        assert len(ys) == len(set(ys)) >= 2, (fig.get_attribute("data-metric"), ys)
    lr = next(f for f in figs if f.get_attribute("data-keys") == "update/lr")  # a constant 3e-4: its own scale
    ticks = [float(t.text) for t in lr.find_elements(By.CSS_SELECTOR, "text.ytick")]
    assert min(ticks) <= 3e-4 <= max(ticks) and max(ticks) - min(ticks) < 3e-4, ticks
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.CSS_SELECTOR, "#curve-pick")).select_by_value("time/iteration_s")
    ys = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#curve-extra text.ytick")]
    assert len(ys) == len(set(ys)) >= 2, ys
