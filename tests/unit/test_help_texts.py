"""Every command and option of walqueued and walqueue-ctl explains itself in --help."""

import click
import pytest

from walqueue import ctl
from walqueue.daemon import cli as daemon_cli

GROUPS = (("walqueued", daemon_cli.cli), ("walqueue-ctl", ctl.cli))


def commands(*, groups=True):
    for program, group in GROUPS:
        if groups:
            yield program, group
        for name, command in group.commands.items():
            yield f"{program} {name}", command


@pytest.mark.parametrize("label,command", list(commands()), ids=[label for label, _ in commands()])
def test_every_option_has_help_and_every_command_a_summary(label, command):
    assert (command.help or command.short_help), f"{label} has no help text"
    for parameter in command.params:
        if isinstance(parameter, click.Option) and not parameter.hidden:
            assert parameter.help, f"{label} {parameter.opts[0]} has no help text"


@pytest.mark.parametrize("label,command", list(commands(groups=False)),
                         ids=[label for label, _ in commands(groups=False)])
def test_the_command_list_summaries_are_not_cut_off(label, command):
    # In an 80-column --help, click cuts a summary past about 65 characters with "...".
    assert not command.get_short_help_str(limit=65).endswith("..."), label


def test_every_ctl_command_lists_the_exit_codes():
    for name, command in ctl.cli.commands.items():
        assert command.epilog and "Exit codes" in command.epilog, name
