"""walqueue-web in a real browser: headless Chromium from Debian (chromium, chromium-driver)
driven by Selenium, against a real walqueued and a real PostgreSQL.

Claims: the overview shows counts a client just changed, in place (no reload); the listing
pages through 100,000 tasks by cursor; a revive clicked in the browser makes the task ready;
a POST without the CSRF token is refused; a hostile id is shown escaped (no script runs).
The daemon's run saves a screenshot of each page as docs/web-*.png (docs/web.md shows them).

Without a browser the tests skip, saying how to install one; under CI=true they fail.
"""

from __future__ import annotations

import os
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest

from walqueue import PutRequest, display

from .daemon import REPO, wait_until
from .web_server import WebServer

pytest.importorskip("starlette")
webdriver = pytest.importorskip("selenium.webdriver")

from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

TASKS = 100_000
BATCH = 5000
HOSTILE = "<script>alert(1)</script>\u202e\x1b[31m"
INSTALL_HINT = "apt-get install chromium chromium-driver (scripts/test does, as root)"
LIVE_SECONDS = 15.0  # the overview refreshes every 5 s


def _browser_paths() -> tuple[str | None, str | None]:
    return (shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver"))


@pytest.fixture(scope="module")
def browser():
    chromium, driver_path = _browser_paths()
    try:
        if chromium is None or driver_path is None:
            raise WebDriverException(f"no chromium or chromedriver on PATH; {INSTALL_HINT}")
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1200,900", "--lang=en"):
            options.add_argument(argument)
        driver = webdriver.Chrome(options=options, service=Service(driver_path))
    except WebDriverException as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the browser cannot start: {exc.msg}", pytrace=False)
        pytest.skip(f"the browser cannot start: {exc.msg}")
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def web(workdir):
    servers = []

    def start(target: str, *args: str) -> WebServer:
        server = WebServer(workdir, target, *args).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
        print(f"--- {server.log_path.name} ---\n{server.log()}")


def make_dead(client, task_id):
    client.put(task_id, {"why": "it failed"}, max_attempts=1)
    (lease,) = client.reserve("browser-test", lease_seconds=60)  # put first: the first due
    assert lease.task_id == task_id
    client.release(lease)
    assert client.get(task_id).status == "dead"


def text_of(browser, element_id):
    return browser.find_element(By.ID, element_id).text


def shown_text(browser, selector):
    """The text of the element at `selector` now, or None while a click's page is still coming
    (the old page's element may be found and then go stale)."""
    try:
        return browser.find_element(By.CSS_SELECTOR, selector).text
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def shown_ids(browser):
    """The ids of a listing page, read in one call (one WebDriver call per element is slow)."""
    return browser.execute_script('return [...document.querySelectorAll("td.id a")].map(a => a.textContent);')


def screenshot(browser, name, *, whole=False):
    """The window as docs/web-NAME.png; `whole`: the window grown to the page's height first."""
    width, height = browser.get_window_size()["width"], browser.get_window_size()["height"]
    if whole:
        page_height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(width, max(height, min(page_height + 120, 2000)))
    try:
        browser.save_screenshot(str(REPO / "docs" / f"web-{name}.png"))
    finally:
        browser.set_window_size(width, height)


def post_without_token(url, fields):
    request = urllib.request.Request(url, data=urllib.parse.urlencode(fields).encode(), method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def check_overview_follows(browser, client, server):
    """The figures change in place: a mark set on the page survives the refresh."""
    browser.get(server.url + "/")
    browser.execute_script("window.notReloaded = true;")
    ready = client.stats().ready  # the page may show figures up to a second old: awaited
    wait_until(lambda: text_of(browser, "count-ready") == str(ready), LIVE_SECONDS,
               f"the overview to show {ready} ready tasks")
    client.put("live-1", {})
    client.put("live-2", {})
    wait_until(lambda: text_of(browser, "count-ready") == str(ready + 2), LIVE_SECONDS,
               "the overview to show the two new tasks")
    assert browser.execute_script("return window.notReloaded === true;")


def check_revive_click(browser, client, server, task_id):
    browser.get(server.url + "/dead")
    row = [row for row in browser.find_elements(By.CSS_SELECTOR, "table.tasks tr")
           if display.name(task_id) in row.text]
    assert row, browser.page_source
    row[0].find_element(By.CSS_SELECTOR, 'button[name="one"]').click()
    wait_until(lambda: "revive: 1 task" in (shown_text(browser, "main") or ""), 10,
               "the revive's answer")
    assert client.get(task_id).status == "ready"


def check_hostile_id(browser, server):
    browser.get(server.url + "/tasks/" + urllib.parse.quote(HOSTILE, safe=""))
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - no script of the id ran
    title = browser.find_element(By.CSS_SELECTOR, "h1 .id").text
    assert title == display.name(HOSTILE) and "\u202e" not in title and "<script>" in title
    scripts = browser.execute_script("return [...document.scripts].map(s => s.src);")
    assert scripts == [server.url + "/static/live.js"]


def check_links_of_odd_ids(browser, server, task_ids):
    """Ids a URL could mistake for something else (dot segments, percent signs) reach their page."""
    for task_id in task_ids:
        browser.get(server.url + "/tasks?prefix=" + urllib.parse.quote(task_id, safe=""))
        (link,) = [link for link in browser.find_elements(By.CSS_SELECTOR, "td.id a")
                   if link.text == display.name(task_id)]
        link.click()
        wait_until(lambda: shown_text(browser, "h1 .id") == display.name(task_id), 10,  # noqa: B023
                   f"the page of {task_id!r}")


def test_the_dashboard_of_a_daemon_in_a_browser(browser, daemon, web):
    from walqueue.client import Client

    client = Client(daemon.socket_path)
    try:
        make_dead(client, "dead-1")
        make_dead(client, "dead-2")
        # The 100,000 tasks go in while the dashboard starts.
        def fill():
            for start in range(0, TASKS, BATCH):
                client.put_many([PutRequest(f"t{number:06d}", {"n": number})
                                 for number in range(start, start + BATCH)])
        filler = threading.Thread(target=fill)
        filler.start()
        server = web(daemon.socket_path, "--allow-writes", "--sample-seconds", "0.5")
        filler.join(120)
        assert not filler.is_alive()
        client.put(HOSTILE, {"note\u202e": "<b>bold?</b>"})
        held = client.reserve("worker-a", lease_seconds=600, limit=2)
        assert len(held) == 2
        odd_ids = ["..", ".", "%2e%2E", "a/../b?c#d"]
        for task_id in odd_ids:
            client.put(task_id, {})

        check_overview_follows(browser, client, server)
        stats = client.stats()
        assert int(text_of(browser, "count-leased")) == stats.leased == 2
        assert int(text_of(browser, "count-dead")) == stats.dead == 2
        screenshot(browser, "overview", whole=True)   # down to the last compactions

        # Paging: page after page follows on, at any depth (each page costs the daemon O(page)).
        browser.get(server.url + "/tasks?size=200")
        seen = []
        for _ in range(3):
            seen += shown_ids(browser)
            browser.find_element(By.CSS_SELECTOR, "a.next").click()
        assert len(seen) == 600 and seen == sorted(seen) and len(set(seen)) == 600
        screenshot(browser, "tasks")
        browser.get(server.url + "/tasks?prefix=t099&size=200")
        tail = []
        while True:
            tail += shown_ids(browser)
            nexts = browser.find_elements(By.CSS_SELECTOR, "a.next")
            if not nexts:
                break
            nexts[0].click()
        assert tail == [f"t{number:06d}" for number in range(99_000, TASKS)]

        browser.get(server.url + "/tasks/" + held[0].task_id)
        assert "1 of 3" in browser.page_source
        screenshot(browser, "task")
        browser.get(server.url + "/leases")
        assert "worker-a" in browser.find_element(By.TAG_NAME, "main").text
        screenshot(browser, "leases")
        browser.get(server.url + "/workers")
        assert "worker-a" in browser.find_element(By.TAG_NAME, "main").text
        # walqueued's connections, the dashboard's own among them (the real daemon's Connections view).
        assert "client='walqueue-web'" in browser.find_element(By.CSS_SELECTOR, "table.connections").text
        screenshot(browser, "workers")
        browser.get(server.url + "/dead")
        screenshot(browser, "dead")
        check_revive_click(browser, client, server, "dead-1")

        assert post_without_token(server.url + "/dead/revive", {"one": "dead-2"}) == 403
        assert client.get("dead-2").status == "dead"
        assert "refused revive" in server.log() and "no valid CSRF token" in server.log()
        assert "revive by local user at 127.0.0.1" in server.log()

        check_hostile_id(browser, server)
        screenshot(browser, "hostile-id")
        check_links_of_odd_ids(browser, server, odd_ids)
    finally:
        client.close()


def test_the_dashboard_of_postgresql_in_a_browser(browser, request, web):
    from tests.postgres import session_server, unique_name
    from walqueue.pg import Client

    postgres = session_server(request)
    queue = unique_name("web")
    client = Client(postgres.dsn, queue=queue)
    try:
        make_dead(client, "pg-dead")
        for number in range(30):
            client.put(f"p{number:03d}", {"n": number})
        client.put(HOSTILE, {})
        server = web(postgres.dsn, "--queue", queue, "--allow-writes")
        assert "***" in server.log() or "password" not in postgres.dsn

        check_overview_follows(browser, client, server)
        assert int(text_of(browser, "count-dead")) == 1
        assert "has no daemon figures" in browser.page_source
        check_revive_click(browser, client, server, "pg-dead")
        assert post_without_token(server.url + "/cancel", {"one": "p000"}) == 403
        assert client.get("p000").status == "ready"
        check_hostile_id(browser, server)
    finally:
        client.close()
