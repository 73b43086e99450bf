"""walqueue-web's views over Starlette's TestClient (httpx), against a fake backend
(tests/unit/web_fake.py): counts, paging, escaping of hostile ids, the write checks
(--allow-writes, the CSRF token, the Origin), passwords, and the pure parts (plot, history,
security rules). The browser tests are tests/process/test_web_browser.py."""

from __future__ import annotations

import base64
import html
import re
import socket
import threading
import time
import urllib.parse

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

from starlette.testclient import TestClient  # noqa: E402

from tests.unit.web_fake import FakeBackend, task  # noqa: E402
from walqueue.web import bounds, security  # noqa: E402
from walqueue.web.app import Settings, create_app  # noqa: E402
from walqueue.web.plot import svg  # noqa: E402
from walqueue.web.samples import History, Sample  # noqa: E402
from walqueue.web.security import Origin  # noqa: E402
from walqueue.web.source import Source  # noqa: E402

NOW = 1_000_000.0
BASE = "http://127.0.0.1:8765"
HOSTILE = ["<script>alert(1)</script>", "\x1b[31mred\x1b[0m", "abc\u202edcba", "a\x00b/c?d#e",
           "quote\"'&amp;", "line\nbreak", "..", ".", "%2e%2E"]


def client_for(backend, *, allow_writes=False, passwords=None, page_size=50):
    source = Source(backend, clock=lambda: NOW)
    settings = Settings(origin=Origin("http", "127.0.0.1", 8765), allow_writes=allow_writes,
                        passwords=passwords, page_size=page_size, sample_seconds=None)
    return TestClient(create_app(source, settings), base_url=BASE)


def csrf_of(page_text):
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page_text).group(1)


def test_the_overview_shows_the_counts_and_the_daemon_figures():
    backend = FakeBackend([task("a"), task("b"), task("c", "leased", worker="w", deadline=NOW + 9),
                           task("d", "dead"), task("e", "completed"), task("f", "completed")])
    with client_for(backend) as client:
        page = client.get("/")
        assert page.status_code == 200
        for key, value in (("ready", 2), ("leased", 1), ("completed", 2), ("dead", 1)):
            assert re.search(rf'id="count-{key}" data-live="{key}">{value}<', page.text), key
        assert "4.2 ms" in page.text and "1 min 5 s" in page.text  # fsync p99, oldest ready
        live = client.get("/overview.json").json()
        assert live["ready"] == "2" and live["dead"] == "1" and live["slow_turns"] == "7"
        backend.add(task("g"))
        assert client.get("/overview.json").json()["ready"] == "2"  # within FRESH_SECONDS: cached


def test_every_page_has_a_strict_policy_and_no_inline_script():
    backend = FakeBackend([task("a"), task("d", "dead")])
    with client_for(backend, allow_writes=True) as client:
        for path in ("/", "/tasks", "/tasks/a", "/dead", "/leases", "/cancel", "/workers", "/nothing"):
            answer = client.get(path)
            policy = answer.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "unsafe-inline" not in policy, path
            assert answer.headers["x-frame-options"] == "DENY"
            scripts = re.findall(r"<script([^>]*)>(.*?)</script>", answer.text, re.S)
            assert all('src="/static/' in attributes and not body for attributes, body in scripts), path
        assert client.get("/static/live.js").status_code == 200


def test_on_postgresql_the_overview_has_no_daemon_figures():
    with client_for(FakeBackend([task("a")], daemon=False)) as client:
        page = client.get("/")
        assert page.status_code == 200 and "has no daemon figures" in page.text
        assert "fsync" not in client.get("/overview.json").json()


def test_the_listing_is_paged_by_cursor_and_never_reads_the_whole_queue():
    backend = FakeBackend([task(f"t{number:04d}") for number in range(120)])
    seen, url = [], "/tasks"
    with client_for(backend, page_size=50) as client:
        while url:
            page = client.get(url)
            assert page.status_code == 200
            seen += re.findall(r'<a href="/tasks/(t\d{4})">', page.text)
            found = re.search(r'class="next" href="([^"]+)"', page.text)
            url = html.unescape(found.group(1)) if found else None
    assert seen == [f"t{number:04d}" for number in range(120)]
    assert [limit for _, _, limit in backend.listings] == [51, 51, 51]


def test_the_listing_filters_by_status_and_id_prefix():
    backend = FakeBackend([task("a1"), task("b1"), task("b2", "dead"), task("b3"), task("b"),
                           task("c1")])
    with client_for(backend) as client:
        page = client.get("/tasks", params={"prefix": "b"})
        assert re.findall(r'<a href="/tasks/(\w+)">', page.text) == ["b", "b1", "b2", "b3"]
        page = client.get("/tasks", params={"prefix": "b", "status": "dead"})
        assert re.findall(r'<a href="/tasks/(\w+)">', page.text) == ["b2"]
        assert client.get("/tasks", params={"status": "nonsense"}).status_code == 400
        assert client.get("/tasks", params={"size": "100000"}).status_code == 400


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_id_is_shown_escaped_and_its_link_leads_to_it(hostile):
    backend = FakeBackend([task(hostile, "dead", payload={"note": hostile, "<b>": 1})])
    with client_for(backend, allow_writes=True) as client:
        listing = client.get("/dead")
        for raw in ("<script>alert", "\x1b", "\u202e", "\x00", "line\nbreak"):
            assert raw not in listing.text
        link = html.unescape(re.search(r'<td class="id"><a href="([^"]+)">', listing.text).group(1))
        if "%" in hostile:  # TestClient decodes a path twice; the browser test follows this one
            link = "/task?id=" + urllib.parse.quote(hostile, safe="")
        page = client.get(link)
        assert page.status_code == 200
        assert "<script>alert" not in page.text and "\x1b" not in page.text and "\u202e" not in page.text
        assert "&lt;script&gt;" in page.text or "<" not in hostile
        assert "\\u202e" in page.text or "\u202e" not in hostile
        # The id round-trips through the form: revive it by its button.
        value = re.search(r'name="one" value="([^"]+)"', listing.text).group(1)
        answer = client.post("/dead/revive", data={"csrf": csrf_of(listing.text), "one": html.unescape(value)})
        assert answer.status_code == 200, answer.text
        assert backend.calls == [("revive", [hostile])]


def test_writes_are_refused_without_allow_writes():
    backend = FakeBackend([task("d", "dead")])
    with client_for(backend, allow_writes=False) as client:
        page = client.get("/dead")
        assert 'action="/dead/revive"' not in page.text
        token = security.csrf_token(client.app.state.settings.secret, "local user at testclient")
        for path in ("/dead/revive", "/leases/release", "/cancel"):
            answer = client.post(path, data={"csrf": token, "one": "d"})
            assert answer.status_code == 403 and "read-only" in answer.text
    assert backend.calls == []


def test_a_post_without_a_valid_csrf_token_is_refused():
    backend = FakeBackend([task("d", "dead")])
    with client_for(backend, allow_writes=True) as client:
        assert client.post("/dead/revive", data={"one": "d"}).status_code == 403
        assert client.post("/dead/revive", data={"one": "d", "csrf": "0" * 64}).status_code == 403
        token = csrf_of(client.get("/dead").text)
        assert client.post("/dead/revive", data={"one": "d", "csrf": token},
                           headers={"Origin": "http://evil.example"}).status_code == 403
        assert client.get("/dead/revive").status_code == 405  # writes are POSTs only
        assert backend.calls == []
        answer = client.post("/dead/revive", data={"one": "d", "csrf": token})
        assert answer.status_code == 200 and backend.get("d").status == "ready"


def test_selected_tasks_are_revived_and_refusals_are_shown():
    backend = FakeBackend([task("d1", "dead"), task("d2", "dead"), task("r", "ready")])
    with client_for(backend, allow_writes=True) as client:
        token = csrf_of(client.get("/dead").text)
        answer = client.post("/dead/revive", data={"csrf": token, "task_id": ["d1", "d2"]})
        assert answer.status_code == 200 and "2 tasks" in answer.text
        assert backend.get("d1").status == backend.get("d2").status == "ready"
        answer = client.post("/dead/revive", data={"csrf": token, "task_id": ["r"]})
        assert answer.status_code == 409 and "is not dead" in answer.text


def test_cancel_completes_a_ready_task_and_names_the_lease_of_a_leased_one():
    backend = FakeBackend([task("r"), task("l", "leased", worker="w1", deadline=NOW + 60)])
    with client_for(backend, allow_writes=True) as client:
        token = csrf_of(client.get("/cancel").text)
        answer = client.post("/cancel", data={"csrf": token, "task_ids": "r\nl\n"})
        assert answer.status_code == 200
        assert "leased by &#39;w1&#39;" in answer.text
    assert backend.get("r").status == "completed" and backend.get("l").status == "leased"


def test_force_release_ends_a_lease():
    backend = FakeBackend([task("l", "leased", worker="w1", deadline=NOW + 60)])
    with client_for(backend, allow_writes=True) as client:
        page = client.get("/leases")
        assert "w1" in page.text
        answer = client.post("/leases/release", data={"csrf": csrf_of(page.text), "one": "l"})
        assert answer.status_code == 200 and backend.get("l").status == "ready"


def test_the_task_page_shows_attempts_generation_lease_and_when():
    backend = FakeBackend([task("t", "leased", worker="w<1>", deadline=int(NOW) + 45, attempts=1,
                                generation=4, available_at=int(NOW) + 180, payload={"b": [1, 2], "a": "x"})])
    with client_for(backend) as client:
        page = client.get("/tasks/t").text
    assert "1 of 3" in page and "<td>4</td>" in page and "w&lt;1&gt;" in page
    assert "(in 3 min)" in page and "(in 45 s)" in page
    assert '&#34;b&#34;: [\n    1,' in page  # pretty-printed, in the payload's order
    with client_for(backend) as client:
        assert client.get("/tasks/nope").status_code == 404


def test_workers_are_listed():
    backend = FakeBackend([task("l", "leased", worker="w\u202e1", deadline=NOW + 60)])
    with client_for(backend) as client:
        page = client.get("/workers").text
    assert "w\\u202e1" in page and "\u202e" not in page


def test_the_workers_page_shows_each_daemon_connection_and_none_on_postgresql():
    from walqueue.protocol import ConnectionView
    backend = FakeBackend([task("l", "leased", worker="w1", deadline=NOW + 60)])
    backend.open_connections = [ConnectionView("fd=7 pid=41 client='<script>x</script>'", ("w1", "w\u202e2"),
                                               1, 1503, 185.0)]
    with client_for(backend) as client:
        page = client.get("/workers").text
    assert "<h2>Connections</h2>" in page and "<script>x" not in page and "&lt;script&gt;x" in page
    row = page[page.index("fd=7"):]
    assert "w1, w\\u202e2" in row and "1503" in row and "3 min 5 s ago" in row
    with client_for(FakeBackend([], daemon=False)) as client:
        assert "Connections" not in client.get("/workers").text


def test_an_unexpected_host_header_is_refused():
    with client_for(FakeBackend()) as client:
        assert client.get("/", headers={"Host": "attacker.example:8765"}).status_code == 421
        assert client.get("/", headers={"Host": "localhost:8765"}).status_code == 200
    remote = Origin("https", "0.0.0.0", 8443)  # beyond loopback the machine's own names are served
    assert remote.host_allowed("queue.example:8443") and not Origin("http", "::1", 1).host_allowed("x:1")


def test_with_a_password_file_every_request_needs_a_name_and_password():
    backend = FakeBackend([task("d", "dead")])
    with client_for(backend, allow_writes=True, passwords={"ann": "s3cret"}) as client:
        assert client.get("/").status_code == 401
        wrong = base64.b64encode(b"ann:nope").decode()
        assert client.get("/", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
        right = {"Authorization": "Basic " + base64.b64encode(b"ann:s3cret").decode()}
        page = client.get("/dead", headers=right)
        assert page.status_code == 200 and "ann" in page.text
        answer = client.post("/dead/revive", data={"csrf": csrf_of(page.text), "one": "d"}, headers=right)
        assert answer.status_code == 200


def test_a_write_is_logged_with_who_and_what(caplog):
    backend = FakeBackend([task("d\u202e", "dead")])
    with caplog.at_level("INFO", logger="walqueue.web"), client_for(backend, allow_writes=True) as client:
        token = csrf_of(client.get("/dead").text)
        client.post("/dead/revive", data={"csrf": token, "task_id": "d%E2%80%AE"})
    lines = [record.getMessage() for record in caplog.records if "revive by" in record.getMessage()]
    assert lines == ['revive by local user at testclient (testclient:50000): asked ["d\\u202e"]; '
                     'done ["d\\u202e"]; refused []']


def test_a_form_beyond_the_bound_is_refused():
    backend = FakeBackend([task("d", "dead")])
    with client_for(backend, allow_writes=True) as client:
        token = csrf_of(client.get("/dead").text)
        answer = client.post("/dead/revive", data={"csrf": token, "task_ids": "x" * (bounds.MAX_FORM_BYTES + 1)})
        assert answer.status_code == 413
    assert backend.calls == []


def test_listening_beyond_loopback_needs_a_certificate_and_a_password_file(tmp_path):
    security.check_listen("127.0.0.1", certificate=None, password_file=None)
    security.check_listen("::1", certificate=None, password_file=None)
    with pytest.raises(security.SecurityError, match="--certificate and --password-file"):
        security.check_listen("0.0.0.0", certificate=None, password_file=None)
    with pytest.raises(security.SecurityError, match="--password-file"):
        security.check_listen("10.1.2.3", certificate="c.pem", password_file=None)
    security.check_listen("10.1.2.3", certificate="c.pem", password_file="p")
    passwords = tmp_path / "passwords"
    passwords.write_text("# operators\nann:s3cret\nbob:x:y\n")
    passwords.chmod(0o644)
    with pytest.raises(security.SecurityError, match="chmod 600"):
        security.read_passwords(str(passwords))
    passwords.chmod(0o600)
    assert security.read_passwords(str(passwords)) == {"ann": "s3cret", "bob": "x:y"}
    passwords.write_text("no colon here\n")
    with pytest.raises(security.SecurityError, match="line 1"):
        security.read_passwords(str(passwords))


def test_the_history_gives_rates_and_compactions_and_no_spike_across_a_restart():
    history = History()
    history.add(Sample(at=0, total=100, completed=10, started=1.0, compactions=0))
    history.add(Sample(at=10, total=150, completed=30, started=1.0, compactions=1,
                       last_compaction_seconds=0.25))
    history.add(Sample(at=20, total=0, completed=0, started=2.0, compactions=0))  # a restart
    history.add(Sample(at=30, total=10, completed=5, started=2.0, compactions=0))
    rates = history.rates()
    assert [(rate.at, rate.puts, rate.acks) for rate in rates] == [(10, 5.0, 2.0), (30, 1.0, 0.5)]
    assert [compaction.seconds for compaction in history.compactions] == [0.25]
    drawing = svg(rates, now=30)
    assert drawing.count("<polyline") == 2 and "expiries" not in drawing


@pytest.mark.parametrize("daemon", [True, False], ids=["walqueued", "postgresql"])
def test_the_plot_draws_expiries_per_second_from_either_backends_count(daemon):
    backend = FakeBackend([task("a")], daemon=daemon)
    clock = [NOW]
    source = Source(backend, clock=lambda: clock[0])
    try:
        for expired in (0, 30, 40):   # sampled 10 s apart
            backend.expired = expired
            source.history.add(source.read_sample())
            clock[0] += 10
        assert [rate.expiries for rate in source.history.rates()] == [3.0, 1.0]
        drawing = svg(source.history.rates(), now=clock[0])
        assert drawing.count("<polyline") == 3 and 'class="series-expiries"' in drawing
        assert "expiries/s" in drawing
    finally:
        source.close()


def test_a_connection_that_sends_no_request_head_is_closed_at_the_deadline(monkeypatch):
    """The head deadline of walqueue.web.bounds, on a real uvicorn server."""
    import uvicorn

    monkeypatch.setattr(bounds, "HEAD_DEADLINE_SECONDS", 0.3)
    backend = FakeBackend([task("a")])
    source = Source(backend, clock=lambda: NOW)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    app = create_app(source, Settings(origin=Origin("http", "127.0.0.1", port), sample_seconds=None))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **bounds.server_options()))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port), timeout=3) as silent:
            silent.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1")  # never finished
            started = time.monotonic()
            assert silent.recv(100) == b""  # closed by the server
            assert 0.2 < time.monotonic() - started < 3
        with socket.create_connection(("127.0.0.1", port), timeout=5) as honest:
            honest.sendall(f"GET /overview.json HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            assert honest.recv(100).startswith(b"HTTP/1.1 200")
            honest.recv(4096)  # the rest of the answer
            honest.sendall(b"GET /overview.json HTTP/1.1\r\n")  # kept alive: the same bound
            started = time.monotonic()
            while honest.recv(4096):
                pass
            assert time.monotonic() - started < 3
        with socket.create_connection(("127.0.0.1", port), timeout=5) as large:
            large.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * (bounds.MAX_REQUEST_HEAD_BYTES + 10))
            assert large.recv(100).startswith(b"HTTP/1.1 400")
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


def test_the_command_line_refuses_what_it_cannot_serve_safely(tmp_path):
    from click.testing import CliRunner

    import walqueue
    from walqueue.web import cli

    runner = CliRunner()
    version = runner.invoke(cli.main, ["--version"], prog_name="walqueue-web")
    assert version.exit_code == 0 and version.output == f"walqueue-web {walqueue.__version__}\n"
    remote = runner.invoke(cli.main, [str(tmp_path / "q"), "--listen", "0.0.0.0:8765"])
    assert remote.exit_code == cli.EXIT_USAGE and "--certificate and --password-file" in remote.output
    bad = runner.invoke(cli.main, [str(tmp_path / "q"), "--listen", "localhost"])
    assert bad.exit_code == cli.EXIT_USAGE and "HOST:PORT" in bad.output
    nobody = runner.invoke(cli.main, [str(tmp_path / "nothing.sock")])
    assert nobody.exit_code == cli.EXIT_UNAVAILABLE and "cannot reach walqueued" in nobody.output
    queue = runner.invoke(cli.main, [str(tmp_path / "q"), "--queue", "orders"])
    assert queue.exit_code == cli.EXIT_USAGE and "--queue names a queue on PostgreSQL" in queue.output


# Each check above must go red on a plausible broken variant (tests/broken_web.py).
BROKEN = [
    ("names_unescaped", lambda: test_a_hostile_id_is_shown_escaped_and_its_link_leads_to_it("abc\u202edcba")),
    ("no_autoescape", lambda: test_a_hostile_id_is_shown_escaped_and_its_link_leads_to_it(HOSTILE[0])),
    ("csrf_always_valid", test_a_post_without_a_valid_csrf_token_is_refused),
    ("whole_listing", test_the_listing_is_paged_by_cursor_and_never_reads_the_whole_queue),
]


@pytest.mark.parametrize("variant, check", BROKEN, ids=[variant for variant, _ in BROKEN])
def test_each_check_goes_red_on_its_broken_variant(variant, check):
    from tests import broken_web

    with broken_web.active(variant), pytest.raises(AssertionError):
        check()


def test_the_head_deadline_check_goes_red_without_the_deadline(monkeypatch):
    from tests import broken_web

    with broken_web.active("no_head_deadline"), pytest.raises((AssertionError, TimeoutError)):
        test_a_connection_that_sends_no_request_head_is_closed_at_the_deadline(monkeypatch)


def test_the_plot_draws_the_rates_the_sampler_saw():
    clock = [NOW]
    backend = FakeBackend([task("a")])
    source = Source(backend, clock=lambda: clock[0])
    settings = Settings(origin=Origin("http", "127.0.0.1", 8765), sample_seconds=None)
    with TestClient(create_app(source, settings), base_url=BASE) as client:
        assert "no samples yet" in client.get("/plot.svg").text
        for step in range(1, 4):
            source.history.add(source.read_sample())
            for number in range(10):
                backend.add(task(f"b{step}-{number}"))
            clock[0] += 10
        drawing = client.get("/plot.svg")
    assert drawing.headers["content-type"].startswith("image/svg+xml")
    assert drawing.text.count("<polyline") == 3 and "no samples yet" not in drawing.text  # expiries at 0
    assert [rate.puts for rate in source.history.rates()] == [1.0, 1.0]


def test_selected_dead_tasks_can_be_cancelled_from_the_dead_page():
    backend = FakeBackend([task("d1", "dead"), task("d2", "dead")])
    with client_for(backend, allow_writes=True) as client:
        page = client.get("/dead").text
        assert 'formaction="/cancel"' in page
        answer = client.post("/cancel", data={"csrf": csrf_of(page), "task_id": ["d1"]})
        assert answer.status_code == 200
    assert backend.get("d1").status == "completed" and backend.get("d2").status == "dead"


def test_a_queue_out_of_reach_is_a_503_page_that_says_so():
    from walqueue.errors import Unavailable

    class Down(FakeBackend):
        def daemon_stats(self):
            raise Unavailable("walqueued at /q: connection refused")

        def tasks(self, status=None, *, after=None, limit=None):
            raise Unavailable("walqueued at /q: connection refused")

    with client_for(Down([task("a")])) as client:
        for path in ("/", "/overview.json", "/tasks"):
            answer = client.get(path)
            assert answer.status_code == 503 and "cannot be reached" in answer.text, path
