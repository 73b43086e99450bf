"""What the tools say to a person: one --version format, limits in the units people use."""

import pytest
from click.testing import CliRunner

import walqueue
from walqueue import InvalidRequest, Queue, speedups
from walqueue import protocol as p
from walqueue.client import calls
from walqueue.ctl import cli as ctl_cli
from walqueue.daemon.cli import cli as daemon_cli
from walqueue.schedule.cli import main as scheduler_main
from walqueue.worker.cli import main as worker_main

TOOLS = {"walqueued": daemon_cli, "walqueue-ctl": ctl_cli, "walqueue-worker": worker_main,
         "walqueue-scheduler": scheduler_main}
TWENTY_MB = 20_000_000


@pytest.mark.parametrize("name", TOOLS)
def test_every_tool_prints_its_version_in_one_format(name):
    result = CliRunner().invoke(TOOLS[name], ["--version"], prog_name=name)
    assert result.exit_code == 0, result.output
    first, *more = result.output.splitlines()
    assert first == f"{name} {walqueue.__version__}"
    # walqueued says which path runs its hot loops too (issue 22); the others say nothing more.
    assert more == ([speedups.describe()] if name == "walqueued" else [])
    assert result.output.endswith("\n")


def test_a_put_too_large_for_the_wire_names_the_16_mib_limit():
    with pytest.raises(InvalidRequest) as refused:
        calls.encode_request(p.Put(id=1, task_id="big", payload={"blob": "x" * TWENTY_MB}))
    message = str(refused.value)
    assert "16 MiB" in message and "19.1 MiB" in message, message
    assert str(p.MAX_BODY_BYTES) not in message, message


def test_the_library_names_the_16_mib_limit(tmp_path):
    with Queue(tmp_path / "q") as queue, pytest.raises(InvalidRequest) as refused:
        queue.put("big", {"blob": "x" * TWENTY_MB})
    assert "16 MiB" in str(refused.value), refused.value
