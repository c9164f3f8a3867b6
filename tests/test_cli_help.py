"""--help that teaches: every option's text and default, examples that parse, the query syntax, a bare command."""
from __future__ import annotations

import argparse
import re
import shlex

import pytest

import hermes_state_cli as cli
from test_commands import run


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Yield (command words, its parser) for every command and `sessions` action."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from _commands(sub, path + (name,))
                else:
                    yield path + (name,), sub


COMMANDS = list(_commands(cli.build_parser()))


def test_every_command_is_covered():
    names = {words[-1] for words, _ in COMMANDS}
    assert {"list", "show", "search", "export", "import", "stats", "recover", "backup", "restore", "doctor", "fts",
            "migrate", "vacuum", "serve", "demo", "completion"} <= names
    assert names <= set(cli.EXAMPLES), names - set(cli.EXAMPLES)


@pytest.mark.parametrize("words", [w for w, _ in COMMANDS], ids=" ".join)
def test_every_option_has_help_and_says_its_default(words):
    parser = dict(COMMANDS)[words]
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, (words, action.dest)
        takes_value = action.nargs != 0 and not isinstance(action, (argparse._StoreTrueAction,
                                                                     argparse._StoreFalseAction))
        if action.option_strings and takes_value and not action.required:
            # every option with a value says what happens without it, in its own words or argparse's
            assert "default" in (cli._Help("x")._get_help_string(action) or ""), (words, action.option_strings)
    assert "examples:" in text and "global options" in text


@pytest.mark.parametrize("words", [w for w, _ in COMMANDS], ids=" ".join)
def test_each_command_has_two_or_three_examples_that_parse(words):
    examples = cli.EXAMPLES[words[-1]]
    assert 2 <= len(examples) <= 3, (words, examples)
    for line in examples:
        command = re.sub(r"\$\([^)]*\)", "X", line)  # what the shell would put there
        argv = shlex.split(command.split("  #")[0].split("|")[0].split(">")[0].split("&&")[0], posix=True)
        if argv[0] in ("gunzip", "eval"):  # a shell line around the command: its own part is checked elsewhere
            continue
        if argv[0] == "hermes-state":
            argv = argv[1:]
        _, rest = cli.split_globals(argv)
        parser = cli.build_parser()
        if rest[:2] == ["sessions", "search"]:  # as the command line reads a query starting with -
            rest = rest[:2] + cli.words_last(cli._SEARCH_PARSER[0], rest[2:])
        args = parser.parse_args(rest)  # a wrong example would exit 2 here
        assert (args.command, args.name) == (words[0], words[-1]), line


def test_search_help_shows_the_query_syntax(hermes_home):
    out = run(hermes_home, "sessions", "search", "--help").stdout
    for line in ("docker -rust", '"docker image"', "docker OR podman", "deploy*", "chat-send"):
        assert line in out
    flat = " ".join(out.split())
    assert "(default: 20)" in flat and "(default: 0)" in flat and "default: every source" in flat


def test_a_bare_command_lists_the_commands(hermes_home):
    bare = run(hermes_home)
    assert bare.returncode == 2 and "the following arguments are required" not in bare.stderr + bare.stdout
    listed = bare.stdout + bare.stderr
    for name in ("sessions", "recover", "backup", "doctor", "serve", "completion"):
        assert f"    {name}" in listed
    sessions = run(hermes_home, "sessions")
    assert sessions.returncode == 2 and "search" in sessions.stdout + sessions.stderr
