"""--metrics-textfile without a daemon: the atomic write, its mode and links, its failures, and
the metrics endpoint asking the loop for text when the file is due (issue 20 item 5)."""

import os
import selectors

import pytest

from walqueue.daemon.metrics_http import MetricsEndpoint
from walqueue.daemon.metrics_textfile import Textfile, TextfileError


@pytest.fixture
def umask_077():
    old = os.umask(0o077)
    yield
    os.umask(old)


def test_the_file_is_replaced_whole_with_its_mode_whatever_the_umask(tmp_path, umask_077):
    textfile = Textfile(str(tmp_path / "walqueue.prom"), mode=0o644)
    assert textfile.write(b"walqueue_up 1\n", 0.0)
    first = os.stat(tmp_path / "walqueue.prom")
    assert (tmp_path / "walqueue.prom").read_bytes() == b"walqueue_up 1\n"
    assert first.st_mode & 0o777 == 0o644  # node_exporter, another user, must read it
    assert textfile.write(b"walqueue_up 2\n", 1.0)
    # A new file renamed over the old one: a reader holding the old one still reads it whole.
    assert os.stat(tmp_path / "walqueue.prom").st_ino != first.st_ino
    assert (tmp_path / "walqueue.prom").read_bytes() == b"walqueue_up 2\n"
    assert sorted(os.listdir(tmp_path)) == ["walqueue.prom"] and textfile.writes == 2


def test_a_link_planted_at_the_temporary_path_is_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    (tmp_path / "walqueue.prom.tmp").symlink_to(victim)
    textfile = Textfile(str(tmp_path / "walqueue.prom"))
    assert textfile.write(b"walqueue_up 1\n", 0.0)
    assert victim.read_bytes() == b"precious\n"
    assert (tmp_path / "walqueue.prom").read_bytes() == b"walqueue_up 1\n"
    assert not (tmp_path / "walqueue.prom").is_symlink()


def test_a_failed_write_is_logged_and_the_next_one_after_the_fix_says_so(tmp_path, caplog):
    directory = tmp_path / "textfiles"
    directory.mkdir()
    textfile = Textfile(str(directory / "walqueue.prom"), interval_seconds=15)
    textfile.probe()
    directory.rmdir()  # an operator removed it while the daemon runs
    with caplog.at_level("INFO", logger="walqueued"):
        assert not textfile.write(b"walqueue_up 1\n", 0.0)
        assert "cannot write the metrics textfile" in caplog.text and "No such file" in caplog.text
        directory.mkdir()
        assert textfile.write(b"walqueue_up 1\n", 15.0)
    assert "is written again" in caplog.text
    assert os.listdir(directory) == ["walqueue.prom"]


def test_the_probe_at_start_names_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError):
        Textfile(str(tmp_path / "missing" / "walqueue.prom")).probe()
    (tmp_path / "a.prom").mkdir()
    with pytest.raises(IsADirectoryError):
        Textfile(str(tmp_path / "a.prom")).probe()
    Textfile(str(tmp_path / "walqueue.prom")).probe()
    assert os.listdir(tmp_path) == ["a.prom"]  # the probe leaves nothing behind


@pytest.mark.parametrize("name", ["walqueue.txt", "walqueue.prom.tmp", "walqueue"])
def test_a_name_the_textfile_collector_would_not_read_is_refused(tmp_path, name):
    with pytest.raises(TextfileError, match=r"\.prom"):
        Textfile(str(tmp_path / name))


def test_the_endpoint_asks_the_loop_for_text_when_the_file_is_due(tmp_path):
    textfile = Textfile(str(tmp_path / "walqueue.prom"), interval_seconds=15)
    endpoint = MetricsEndpoint(textfile=textfile)  # no --metrics-listen: no socket at all
    selector = selectors.DefaultSelector()
    try:
        endpoint.start(selector)
        assert endpoint.url is None and not selector.get_map()
        assert endpoint.next_deadline() == float("-inf")  # the first turn writes it
        endpoint.expire(100.0)
        assert endpoint.wanted
        endpoint.publish("walqueue_up 1\n", 100.0)
        assert (tmp_path / "walqueue.prom").read_text() == "walqueue_up 1\n"
        assert not endpoint.wanted and endpoint.next_deadline() == 115.0
        endpoint.expire(114.9)
        assert not endpoint.wanted
        endpoint.expire(115.0)
        assert endpoint.wanted
    finally:
        endpoint.close()
        selector.close()
