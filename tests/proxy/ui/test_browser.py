"""The Live UI in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by Selenium; nothing downloads a browser), on a seeded run with stage times,
several weight versions, validation sessions, epochs, edited-history forks and a flagged
trainer step: log in, read the overview, the steps and the epochs pages and check their
numbers against the database (computed here from its rows, not through the read
models), check that every chart label is drawn inside its chart, follow a task to its
sessions, filter them, and open a fork to see what it changed.

Screenshots go to ``$LEGO_TEST_ARTIFACTS`` (default: a ``test-artifacts`` directory under
pytest's temporary root). With ``LEGO_DOCS_SCREENSHOTS`` set (``docs/images``), the
documentation's screenshots (``docs/live-ui.md``) are written there as well, one PNG per
page section, each kept under ``MAX_DOCS_PNG`` bytes."""

from __future__ import annotations

import math
import os
import shutil
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from recorder.database import create_engine
from recorder.records import EXCLUDED_TERMINATIONS
from recorder.schema import sessions, turns
from tests.proxy.conftest import ADMIN_KEY, Proxy
from tests.recorder.read_models.seed import EDITED_SUFFIX, Outcome, SeededRun, seed_run

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path(shutil.which("chromedriver") or "/usr/bin/chromedriver")
MAX_DOCS_PNG = 200_000
STAGE_NAMES = ("sandbox_setup", "agent_setup", "agent_execution", "verification", "other")

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


@pytest.fixture(scope="module")
def docs_images() -> Path | None:
    configured = os.environ.get("LEGO_DOCS_SCREENSHOTS")
    if not configured:
        return None
    path = Path(configured)
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
        "--hide-scrollbars",
        "--window-size=1280,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


# -- the seeded run --------------------------------------------------------------------
def plan(v: int, n: int) -> Outcome:
    if n % 9 == 8:
        return ("harness_error", None, 1, 4, 0)
    if n % 7 == 5:
        return ("agent_timeout", None, 2, 6, 0)
    if n % 5 == 3:
        return ("max_turns", 0.0, 3, 10 + v, 0)
    return ("completed", 1.0 if (n + v) % 3 else 0.0, 2 + n % 2, 8 + v, int(n % 5 == 0))


def stage_plan(v: int, n: int) -> Mapping[str, float] | None:
    if n % 9 == 8:
        return {"sandbox_setup": 40.0 + n}  # the harness crashed before anything else ran
    return {
        "sandbox_setup": 1.0 + (n * 7) % 5,
        "agent_setup": 0.5 + 0.1 * (n % 3),
        "agent_execution": 20.0 + 5 * v + n,
        "verification": 2.0 + n % 4,
        "other": 0.25,
    }


ALIGNMENT: list[dict[str, float | None]] = [
    {"pearson_r": 0.9993, "abs_dlogp_p99": 0.0021, "entropy": 0.131},
    {"pearson_r": 0.9991, "abs_dlogp_p99": 0.0024, "entropy": 0.142},
    {"pearson_r": 0.9969, "abs_dlogp_p99": 0.0098, "entropy": 0.188},
    {"pearson_r": 0.9995, "abs_dlogp_p99": 0.0020, "entropy": 0.151},
]
FLAGGED = {2: ["pearson_r 0.9969 < 0.998", "abs_dlogp_p99 0.0098 > 0.005"]}


async def seed(url: str) -> SeededRun:
    return await seed_run(
        url,
        versions=4,
        groups_per_version=3,
        group_size=4,
        plan=plan,
        tasks=4,
        epoch_groups=True,  # 12 groups of 4 tasks: epochs 0, 1, 2 across the versions
        stages=stage_plan,
        fork=lambda v, n: n == 1,
        validation=lambda v: (
            [("completed", 1.0), ("completed", 0.0), ("completed", 1.0)] if v % 2 == 0 else []
        ),
        alignment=ALIGNMENT,
        flagged=FLAGGED,
    )


@dataclass(frozen=True)
class Row:
    """One session as the database holds it, and the version of its first turn."""

    id: str
    task_id: str
    group_id: str
    purpose: str
    termination: str | None
    reward: float | None
    stages: Mapping[str, float] | None
    version: str


async def database_rows(url: str, run_id: str) -> list[Row]:
    engine = create_engine(url)
    async with engine.connect() as conn:
        first_turns: dict[str, tuple[int, str]] = {}
        for session_id, seq, version in await conn.execute(
            select(turns.c.session_id, turns.c.seq, turns.c.weight_version)
            .join(sessions, sessions.c.id == turns.c.session_id)
            .where(sessions.c.run_id == run_id)
        ):
            if session_id not in first_turns or seq < first_turns[session_id][0]:
                first_turns[session_id] = (seq, version)
        rows = [
            Row(r.id, r.task_id, r.group_id, r.purpose, r.termination, r.reward, r.stages, "")
            for r in await conn.execute(select(sessions).where(sessions.c.run_id == run_id))
        ]
    await engine.dispose()
    return [
        Row(**{**r.__dict__, "version": first_turns[r.id][1]})  # every seeded session has turns
        for r in rows
    ]


def nearest_rank(values: Sequence[float], percent: int) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(percent * len(ordered) / 100) - 1]


def number(text: str) -> float:
    return float(text.strip().rstrip("%").replace(",", ""))


# -- the browser -----------------------------------------------------------------------
def log_in(browser: Any, proxy: Proxy, target: str, wrong_first: bool = False) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{proxy.url}{target}")
    assert "/ui/login" in browser.current_url  # no cookie yet: sent to the login form
    # Pause the live reloads before the first live page loads (localStorage is per origin),
    # so no timer armed by a page can reload it under the test's feet.
    browser.execute_script("localStorage.setItem('lego-live', 'off')")
    if wrong_first:
        browser.find_element(By.ID, "key").send_keys("wrong")
        browser.find_element(By.ID, "login").click()
        error = WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.ID, "login-error"))
        assert "not the admin key" in error[0].text
    browser.find_element(By.ID, "key").send_keys(ADMIN_KEY)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, 20).until(
        lambda d: (
            d.current_url.endswith(target)
            and d.execute_script("return document.readyState") == "complete"
        )
    )


def labels_outside_their_chart(browser: Any) -> list[str]:
    """Every chart text whose drawn box leaves its SVG's viewBox (as Chromium lays it out)."""
    return list(
        browser.execute_script(
            """
            const out = [];
            for (const svg of document.querySelectorAll('svg.chart')) {
              const box = svg.viewBox.baseVal;
              for (const text of svg.querySelectorAll('text')) {
                const b = text.getBBox();
                if (b.x < -0.5 || b.y < -0.5 || b.x + b.width > box.width + 0.5
                    || b.y + b.height > box.height + 0.5) {
                  out.push(svg.getAttribute('aria-label') + ': ' + text.textContent);
                }
              }
            }
            return out;
            """
        )
    )


class Shots:
    """Screenshots: every page into the artifacts, chosen sections into the docs."""

    def __init__(self, browser: Any, artifacts: Path, docs: Path | None) -> None:
        self.browser, self.artifacts, self.docs = browser, artifacts, docs

    def page(self, name: str) -> None:
        self.browser.save_screenshot(str(self.artifacts / f"{name}.png"))
        assert (self.artifacts / f"{name}.png").stat().st_size > 10_000

    def section(self, name: str, css: str) -> None:
        from selenium.webdriver.common.by import By

        if self.docs is None:
            return
        element = self.browser.find_element(By.CSS_SELECTOR, css)
        self.browser.execute_script("arguments[0].scrollIntoView()", element)
        path = self.docs / f"{name}.png"
        element.screenshot(str(path))
        assert 5_000 < path.stat().st_size < MAX_DOCS_PNG, (name, path.stat().st_size)


async def test_the_run_pages_show_the_numbers_the_database_holds(
    proxy: Proxy, browser: Any, artifacts: Path, docs_images: Path | None
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url = proxy.settings.effective_database_url
    run = await seed(url)
    rows = await database_rows(url, run.id)
    train = [r for r in rows if r.purpose == "train"]
    held_out = [r for r in rows if r.purpose == "validation"]
    assert len(train) == 48
    assert len(held_out) == 6
    shots = Shots(browser, artifacts, docs_images)
    settle = WebDriverWait(browser, 20)

    def text(css: str) -> str:
        return str(browser.find_element(By.CSS_SELECTOR, css).text)

    # The overview: training numbers over training sessions, validation apart.
    log_in(browser, proxy, f"/ui/runs/{run.id}", wrong_first=True)
    shots.page("overview")
    assert int(text("#total-sessions")) == len(rows)
    assert int(text("#validation-sessions")) == len(held_out)
    for version in run.versions:
        mine = [r for r in train if r.version == version]
        graded = [r for r in mine if r.termination not in EXCLUDED_TERMINATIONS]
        base = f'tr[data-version="{version}"] td'
        assert int(text(f'{base}[data-field="sessions"]')) == len(mine)
        assert int(text(f'{base}[data-field="graded"]')) == len(graded)
        solved = sum((r.reward or 0) >= 1 for r in graded)
        assert text(f'{base}[data-field="solve_rate"]') == f"{solved / len(graded) * 100:.1f}%"
        rewards = [r.reward for r in held_out if r.version == version and r.reward is not None]
        shown = text(f'{base}[data-field="validation_reward"]')
        if rewards:
            assert number(shown) == pytest.approx(sum(rewards) / len(rewards), abs=1e-4)
        else:
            assert shown == "\u2013"
    flagged = browser.find_elements(By.CSS_SELECTOR, "#flagged-steps tbody tr")
    assert [row.get_attribute("data-step") for row in flagged] == ["2"]
    assert [li.text for li in flagged[0].find_elements(By.CSS_SELECTOR, "li")] == FLAGGED[2]
    figures = browser.find_elements(By.CSS_SELECTOR, "#curves figure")
    assert [f.get_attribute("data-chart") for f in figures] == [
        "train reward",
        "validation reward",
        "policy entropy",
        "mean response length (tokens)",
    ]
    pearson = browser.find_element(By.CSS_SELECTOR, 'figure[data-chart="pearson_r"]')
    ticks = [t.text for t in pearson.find_elements(By.CSS_SELECTOR, "text.y-tick")]
    assert len(set(ticks)) == len(ticks) > 2  # 0.9969 .. 0.9995 read apart, not "1" twice
    assert len(pearson.find_elements(By.CSS_SELECTOR, "circle.mark")) == 1
    assert labels_outside_their_chart(browser) == []
    shots.section("overview-curves", "#curves")
    shots.section("overview-flagged", "#flagged")

    # The steps page: Table 4 over the run's training trials, and per step.
    browser.find_element(By.LINK_TEXT, "steps").click()
    settle.until(lambda d: d.find_elements(By.ID, "stage-table"))
    shots.page("steps")
    timed = [r for r in train if r.stages]
    assert int(text("#timed-trials")) == len(timed)
    totals = [sum(r.stages.values()) for r in timed if r.stages]
    for stage in (*STAGE_NAMES, "total"):
        values = (
            totals
            if stage == "total"
            else [r.stages[stage] for r in timed if r.stages and stage in r.stages]
        )
        base = f'#stage-table tr[data-stage="{stage}"] td'
        assert int(text(f'{base}[data-field="trials"]')) == len(values)
        assert number(text(f'{base}[data-field="mean"]')) == pytest.approx(
            sum(values) / len(values), rel=1e-3
        )
        for p in (50, 90, 99):
            assert number(text(f'{base}[data-field="p{p}"]')) == pytest.approx(
                nearest_rank(values, p), rel=1e-3
            )
        share = number(text(f'{base}[data-field="share"]')) / 100
        assert share == pytest.approx(sum(values) / sum(totals), abs=0.0006)
    step = browser.find_element(By.CSS_SELECTOR, f'details.step[data-version="{run.versions[1]}"]')
    step.find_element(By.TAG_NAME, "summary").click()
    at_v1 = [r.stages for r in timed if r.version == run.versions[1] and r.stages]
    cell = step.find_element(
        By.CSS_SELECTOR, 'tr[data-stage="agent_execution"] td[data-field="p90"]'
    )
    assert number(cell.text) == pytest.approx(
        nearest_rank([s["agent_execution"] for s in at_v1 if "agent_execution" in s], 90)
    )
    for version in run.versions:
        ended: dict[str, int] = defaultdict(int)
        for r in train:
            if r.version == version:
                ended[r.termination or "active"] += 1
        for reason, count in ended.items():
            shown = text(f'#terminations tr[data-version="{version}"] td[data-reason="{reason}"]')
            assert int(shown.split()[0]) == count
    excluded_head = browser.find_elements(By.CSS_SELECTOR, "#terminations thead th.num.excluded")
    assert {h.text for h in excluded_head} == {"agent_timeout", "harness_error"}
    assert browser.find_elements(By.CSS_SELECTOR, 'figure[data-chart="terminations"] rect.down')
    assert labels_outside_their_chart(browser) == []
    shots.section("steps-stage-times", "#stage-times")
    shots.section("steps-terminations", "#termination-profile")

    # The epochs page: groups by successes, k of N over graded samples.
    browser.find_element(By.LINK_TEXT, "epochs").click()
    settle.until(lambda d: d.find_elements(By.ID, "epochs"))
    shots.page("epochs")
    per_group: dict[str, list[float]] = defaultdict(list)
    for r in train:
        if r.termination and r.termination not in EXCLUDED_TERMINATIONS and r.reward is not None:
            per_group[r.group_id].append(r.reward)
    histogram: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for group, rewards in per_group.items():
        if len(rewards) >= 2:
            epoch = int(group.rsplit(".e", 1)[1])
            histogram[epoch][f"{sum(x >= 1 for x in rewards)}/{len(rewards)}"] += 1
    assert sorted(histogram) == [0, 1, 2]
    for epoch, bins in histogram.items():
        base = f'#epochs tr[data-epoch="{epoch}"] td'
        assert int(text(f'{base}[data-field="groups"]')) == sum(bins.values())
        for label, count in bins.items():
            assert int(text(f'{base}[data-bin="{label}"]')) == count
        k_n = {b: tuple(b.split("/")) for b in bins}
        zero = sum(n for b, n in bins.items() if k_n[b][0] in ("0", k_n[b][1]))
        share = number(text(f'{base}[data-field="zero_variance_share"]')) / 100
        assert share == pytest.approx(zero / sum(bins.values()), abs=0.0006)
    assert labels_outside_their_chart(browser) == []
    shots.section("epochs-histogram", "#histogram")


async def test_a_task_leads_to_its_sessions_and_a_fork_shows_its_edit(
    proxy: Proxy, browser: Any, artifacts: Path, docs_images: Path | None
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    url = proxy.settings.effective_database_url
    run = await seed(url)
    rows = await database_rows(url, run.id)
    shots = Shots(browser, artifacts, docs_images)
    settle = WebDriverWait(browser, 20)

    log_in(browser, proxy, f"/ui/runs/{run.id}/tasks")
    shots.page("tasks")
    assert not browser.find_element(By.ID, "live").is_selected()  # the pause held on load
    browser.find_element(By.CSS_SELECTOR, 'tr[data-task="task-1"] a.task-link').click()
    settle.until(lambda d: "task=task-1" in d.current_url)
    listed = browser.find_elements(By.CSS_SELECTOR, "#sessions tbody tr[data-session]")
    of_task = {r.id for r in rows if r.task_id == "task-1"}
    assert {row.get_attribute("data-session") for row in listed} == of_task
    assert int(browser.find_element(By.ID, "session-total").text) == len(of_task)

    # Filter the whole run down to the forked sessions, then sort them by reward.
    browser.find_element(By.NAME, "task").clear()
    Select(browser.find_element(By.NAME, "fork")).select_by_value("edited_history")
    Select(browser.find_element(By.NAME, "purpose")).select_by_value("train")
    browser.find_element(By.ID, "apply-filters").click()
    settle.until(lambda d: "fork=edited_history" in d.current_url)
    forked = {s.id for s in run.sessions if s.forked}
    assert len(forked) == 4
    listed = browser.find_elements(By.CSS_SELECTOR, "#sessions tbody tr[data-session]")
    assert {row.get_attribute("data-session") for row in listed} == forked
    browser.find_element(By.CSS_SELECTOR, 'a[data-sort="reward"]').click()
    settle.until(lambda d: "sort=reward" in d.current_url)
    assert "fork=edited_history" in browser.current_url  # sorting kept the filter
    cells = browser.find_elements(By.CSS_SELECTOR, '#sessions td[data-field="reward"]')
    rewards = [c.text for c in cells]
    scalar = [float(x) for x in rewards if x != "\u2013"]
    assert scalar == sorted(scalar)
    shots.page("sessions")
    shots.section("sessions-filtered", "main")

    # The excluded sessions, apart: every one of them an environment failure.
    browser.get(f"{proxy.url}/ui/runs/{run.id}/sessions?excluded=yes")
    shown = browser.find_elements(By.CSS_SELECTOR, '#sessions td[data-field="termination"]')
    excluded = [r for r in rows if r.termination in EXCLUDED_TERMINATIONS]
    assert len(shown) == len(excluded)
    assert all(cell.text.split()[0] in EXCLUDED_TERMINATIONS for cell in shown)

    # A forked session: turns numbered 1..n, the fork's diff against its parent.
    session = next(s for s in run.sessions if s.forked)
    browser.get(f"{proxy.url}/ui/sessions/{session.id}")
    turns_shown = settle.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#turns li.turn"))
    numbers = [t.find_element(By.CSS_SELECTOR, ".turn-number").text for t in turns_shown]
    assert numbers == [f"#{n}" for n in range(1, session.turns + 1)]
    fork = browser.find_element(By.CSS_SELECTOR, 'li.turn[data-fork-reason="edited_history"]')
    edit = fork.find_element(By.CSS_SELECTOR, "details.history-edit")
    assert edit.find_element(By.CSS_SELECTOR, ".edit-count").text == "1"
    before = edit.find_element(By.CSS_SELECTOR, ".diff-changed .diff-before").text
    after = edit.find_element(By.CSS_SELECTOR, ".diff-changed .diff-after").text
    assert f"solve {session.task_id}" in before
    assert f"solve {session.task_id}{EDITED_SUFFIX}" in after
    removed = edit.find_elements(By.CSS_SELECTOR, '.token-diff [data-kind="removed"]')
    added = edit.find_elements(By.CSS_SELECTOR, '.token-diff [data-kind="added"]')
    assert [r.get_attribute("data-count") for r in removed] == ["1"]
    assert [a.get_attribute("data-count") for a in added] == ["1", "2"]
    turns_shown[0].find_element(By.CSS_SELECTOR, "details.tokens summary").click()
    assert turns_shown[0].find_elements(By.CSS_SELECTOR, ".token-stream span[title]")
    shots.page("session")
    shots.section("session-fork", 'li.turn[data-fork-reason="edited_history"]')
