"""The Live UI in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by Selenium; nothing downloads a browser): log in, read the overview of a seeded
run and check its numbers against the database, open the sessions list, click into a
session and see its turns. Screenshots go to ``$LEGO_TEST_ARTIFACTS`` (default: a
``test-artifacts`` directory under pytest's temporary root)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from recorder.database import create_engine
from recorder.schema import sessions, turns
from tests.proxy.conftest import ADMIN_KEY, Proxy
from tests.recorder.read_models.seed import SeededRun, seed_run

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path(shutil.which("chromedriver") or "/usr/bin/chromedriver")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (.ci/run installs them)",
)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.environ.get("LEGO_TEST_ARTIFACTS")
    path = Path(configured) if configured else tmp_path_factory.mktemp("test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser() -> Iterator[Any]:
    """A fresh browser per test: cookies ignore ports, so one proxy's login would leak."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def plan(v: int, n: int) -> tuple[str | None, float | None, int, int, int]:
    if n % 9 == 8:
        return ("harness_error", None, 1, 4, 0)
    return ("completed", 1.0 if (n + v) % 3 else 0.0, 2 + n % 2, 8 + v, int(n % 5 == 0))


async def test_browser_logs_in_reads_the_overview_and_opens_a_session(
    proxy: Proxy, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url = proxy.settings.effective_database_url
    run: SeededRun = await seed_run(url, versions=3, groups_per_version=3, group_size=4, plan=plan)
    engine = create_engine(url)
    async with engine.connect() as conn:
        total = await conn.scalar(select(func.count()).where(sessions.c.run_id == run.id))
        turn_count = await conn.scalar(
            select(func.count())
            .select_from(turns.join(sessions, sessions.c.id == turns.c.session_id))
            .where(sessions.c.run_id == run.id)
        )
        by_version = {
            version: (n, solved)
            for version, n, solved in await conn.execute(
                select(
                    turns.c.weight_version,
                    func.count(func.distinct(sessions.c.id)),
                    func.count(func.distinct(sessions.c.id)).filter(sessions.c.reward >= 1),
                )
                .join(sessions, sessions.c.id == turns.c.session_id)
                .where(sessions.c.run_id == run.id)
                .group_by(turns.c.weight_version)
            )
        }
        graded = {
            version: n
            for version, n in await conn.execute(
                select(turns.c.weight_version, func.count(func.distinct(sessions.c.id)))
                .join(sessions, sessions.c.id == turns.c.session_id)
                .where(sessions.c.run_id == run.id, sessions.c.termination == "completed")
                .group_by(turns.c.weight_version)
            )
        }
    await engine.dispose()

    # A click returns before the next page has loaded: wait for what each step leads to.
    settle = WebDriverWait(browser, 20)
    browser.get(f"{proxy.url}/ui/runs/{run.id}")
    assert "/ui/login" in browser.current_url  # no cookie yet: sent to the login form
    browser.find_element(By.ID, "key").send_keys("wrong")
    browser.find_element(By.ID, "login").click()
    error = settle.until(lambda d: d.find_elements(By.ID, "login-error"))
    assert "not the admin key" in error[0].text
    browser.find_element(By.ID, "key").send_keys(ADMIN_KEY)
    browser.find_element(By.ID, "login").click()
    settle.until(lambda d: d.current_url.endswith(f"/ui/runs/{run.id}"))
    browser.save_screenshot(str(artifacts / "overview.png"))

    assert int(browser.find_element(By.ID, "total-sessions").text) == total == 36
    for version in run.versions:
        row = browser.find_element(By.CSS_SELECTOR, f'tr[data-version="{version}"]')

        def cell(field: str, row: Any = row) -> str:
            return str(row.find_element(By.CSS_SELECTOR, f'td[data-field="{field}"]').text)

        sessions_at, solved_at = by_version[version]
        assert int(cell("sessions")) == sessions_at
        assert int(cell("graded")) == graded[version]
        assert cell("solve_rate") == f"{solved_at / graded[version] * 100:.1f}%"
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    assert len(charts) >= 8
    assert browser.find_elements(By.CSS_SELECTOR, "#collapse tbody tr")

    browser.find_element(By.LINK_TEXT, "sessions").click()
    links = settle.until(lambda d: d.find_elements(By.CSS_SELECTOR, "a.session-link"))
    browser.save_screenshot(str(artifacts / "sessions.png"))
    assert len(links) == 36
    links[0].click()
    shown = settle.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#turns li.turn"))
    assert len(shown) == int(browser.find_element(By.ID, "turn-count").text)
    assert len(shown) in (2, 3)
    assert shown[0].get_attribute("data-classification") == "root"
    assert shown[1].get_attribute("data-classification") == "extend"
    shown[0].find_element(By.CSS_SELECTOR, "details.tokens summary").click()
    assert shown[0].find_elements(By.CSS_SELECTOR, ".token-stream span[title]")
    browser.save_screenshot(str(artifacts / "session.png"))
    assert turn_count is not None
    for name in ("overview.png", "sessions.png", "session.png"):
        assert (artifacts / name).stat().st_size > 10_000
