"""--help that teaches: every option's text and default, examples that parse, the query syntax, a bare command."""
from __future__ import annotations

import re
import shlex

import pytest

import hermes_state_cli as cli
from conftest import run

# Every command and `sessions` action, as declared once (the top-level and `sessions` help list them).
COMMANDS = [tuple(c.words) for c in cli.COMMANDS]
SESSIONS = [words[1] for words in COMMANDS if words[0] == "sessions"]
TOP = [words[0] for words in COMMANDS if len(words) == 1]


def _help(capsys, *words: str) -> str:
    with pytest.raises(SystemExit) as done:
        cli.parse_command([*words, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def _options(text: str) -> dict[str, str]:
    """Return {the option as listed ("-n LIMIT, --limit LIMIT"): its help text} from the "options:" part of --help."""
    part = text.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    found: dict[str, str] = {}
    last = None
    for line in part.splitlines():
        head = re.match(r"  (-\S.*?)(?:  +(\S.*))?$", line)
        if head and not line.startswith("   "):
            last = head.group(1)
            found[last] = head.group(2) or ""
        elif last is not None:
            found[last] += " " + line.strip()
    return found


def test_the_command_lists_name_every_command(hermes_home):
    top = run(hermes_home).stdout
    sessions = run(hermes_home, "sessions").stdout
    assert all(f"    {name}" in top for name in ["sessions", *TOP])
    assert all(f"    {name}" in sessions for name in SESSIONS)
    assert set(cli.EXAMPLES) == set(SESSIONS) | set(TOP)


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_every_option_has_help_and_says_its_default(words, capsys):
    text = _help(capsys, *words)
    usage = " ".join(text.split("\n\n", 1)[0].split())
    options = _options(text)
    for listed, help_text in options.items():
        if listed.startswith("-h"):
            continue
        assert help_text.strip(), (words, listed)
        name, *value = listed.split(",")[-1].split()
        required = f"[{name}" not in usage
        if value and not required:  # an option that takes a value says what happens without it
            assert "default" in help_text, (words, listed, help_text)
    assert "examples:" in text and "global options" in text


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_each_command_has_two_or_three_examples_that_parse(words, capsys):
    examples = cli.EXAMPLES[words[-1]]
    assert 2 <= len(examples) <= 3, (words, examples)
    shown = _help(capsys, *words)
    for line in examples:
        assert line.split("  #")[0].strip() in shown  # --help shows each one
        command = re.sub(r"\$\([^)]*\)", "X", line)  # what the shell would put there
        argv = shlex.split(command.split("  #")[0].split("|")[0].split(">")[0].split("&&")[0])
        if argv[0] in ("gunzip", "eval"):  # a shell line around the command; its own part is the next example
            continue
        if argv[0] == "hermes-state":
            argv = argv[1:]
        _, rest = cli.split_globals(argv)
        args = cli.parse_command(rest)  # a wrong example exits 2 here
        assert (args.command, args.name) == (words[0], words[-1]), line


def test_a_wrong_command_line_is_a_usage_error_not_a_traceback(capsys):
    for words in (["sessions", "list", "--limit", "many"], ["sessions", "stats", "--by", "year"], ["nope"]):
        with pytest.raises(cli.UsageError, match="--help` says"):
            cli.parse_command(words)
        assert capsys.readouterr().err == ""  # nothing printed on the way: main prints the one line


@pytest.mark.parametrize("argv, says", [
    (["sessions", "lst"], "unknown command 'lst' (did you mean list?); `hermes-state sessions --help`"),
    (["doctr"], "unknown command 'doctr' (did you mean doctor?); `hermes-state --help`"),
    (["sessions", "list", "--limt", "3"], "sessions list does not take --limt (did you mean --limit?); "
                                          "`hermes-state sessions list --help`"),
    (["sessions", "search", "x", "--role", "usr"], "unknown value of --role 'usr' (did you mean user?)"),
    (["fts", "stat"], "unknown action 'stat' (did you mean status?); `hermes-state fts --help`"),
    (["sessions", "prune"], "the following arguments are required: --older-than; `hermes-state sessions prune --help`"),
])
def test_a_usage_error_is_one_line_with_the_nearest_right_word(hermes_home, argv, says):
    out = run(hermes_home, *argv)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and says in out.stderr and "usage:" not in out.stderr, out.stderr


def test_search_help_shows_the_query_syntax(hermes_home):
    out = run(hermes_home, "sessions", "search", "--help").stdout
    for line in ("docker -rust", '"docker image"', "docker OR podman", "deploy*", "chat-send"):
        assert line in out
    flat = " ".join(out.split())
    assert "(default: 20)" in flat and "(default: 0)" in flat and "default: every source" in flat


def test_a_bare_command_lists_the_commands(hermes_home):
    bare = run(hermes_home)
    assert bare.returncode == 2 and "the following arguments are required" not in bare.stderr + bare.stdout
    assert "    recover" in bare.stdout and "    completion" in bare.stdout
    sessions = run(hermes_home, "sessions")
    assert sessions.returncode == 2 and "    search" in sessions.stdout
