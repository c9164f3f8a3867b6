"""Shell completion for `hermes-state`: the scripts for bash, zsh and fish, and the session ids they offer.

Owns: `script(shell, words)` (what `hermes-state completion SHELL` prints: the commands, flags and
choices `words` lists, which the command line reads from its parser when it runs `completion`)
and `python -m hermes_state_complete ids PREFIX [--db PATH | --profile NAME]`, which the scripts
run on each Tab to list the ids starting with PREFIX in the store the line names (and
`profiles [PREFIX]`, the profile names `-p` takes). That path
imports `sqlite3` and nothing of this library, and opens the file read-only (`mode=ro`): a Tab
press never waits for the library to load, never writes, and never creates a file.
Does not own: the commands themselves (hermes_state_cli).
"""
from __future__ import annotations

import os
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

SHELLS = ("bash", "zsh", "fish")
MAX_IDS = 200
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # never a path: no / and no leading dot


def store_path(db: str | None = None, profile: str | None = None) -> Path | None:
    """Return the store a command line names: --db, else the profile's, else <HERMES_HOME>/state.db; None for a bad profile name.

    A profile is one of the current root (HERMES_HOME's, or its root when it is a profile
    itself; else ~/.hermes), as the command line finds it.
    """
    if db:
        return Path(db).expanduser()
    home = Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes").expanduser()
    if profile:
        if not _PROFILE_NAME.fullmatch(profile):
            return None
        root = home.parent.parent if home.parent.name == "profiles" else home
        home = root if profile == "default" else root / "profiles" / profile
    return home / "state.db"


def ids(prefix: str, db: str | None = None, profile: str | None = None) -> list[str]:
    """Return the session ids starting with `prefix` in the store the line names; [] when none can be read."""
    path = store_path(db, profile)
    if path is None or not path.is_file():
        return []
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=0.5)
    except sqlite3.Error:
        return []
    try:
        rows = conn.execute("SELECT id FROM sessions WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
                            (prefix, prefix + "\U0010ffff", MAX_IDS)).fetchall()
    except sqlite3.Error:  # not a store, locked past the timeout, damaged: no ids to offer
        return []
    finally:
        conn.close()
    return [r[0] for r in rows if r[0].startswith(prefix)]


def profiles(prefix: str = "") -> list[str]:
    """Return the profile names of the current root starting with `prefix`: "default" and each under profiles/."""
    home = Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes").expanduser()
    root = home.parent.parent if home.parent.name == "profiles" else home
    try:
        named = sorted(p.name for p in (root / "profiles").iterdir() if p.is_dir() and _PROFILE_NAME.fullmatch(p.name))
    except OSError:  # no profiles yet
        named = []
    return [name for name in ["default", *named] if name.startswith(prefix)]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _case(arms: dict[str, list[str]], variable: str, indent: str) -> list[str]:
    # A bash `case` setting `variable` to the words of the arm whose key matches.
    lines = []
    for key, values in arms.items():
        lines.append(f"{indent}{_quote(key)}) {variable}={_quote(' '.join(values))};;")
    return lines


def _is_option_choice(key: str) -> bool:
    # "sessions search --role" and "--color" name an option's values; "fts" a command's argument.
    return " -" in key or key.startswith("-")


def _split(words: dict[str, Any]) -> tuple[dict[str, list[str]], ...]:
    # (commands of two words, an option's values after "command option", after an option alone,
    # a command's argument values), each {key: words}.
    groups = {name: actions for name, actions in words["commands"].items() if actions}
    options = {key: values for key, values in words["choices"].items() if _is_option_choice(key)}
    positional = {key: values for key, values in words["choices"].items() if key not in options}
    return (groups, {k: v for k, v in options.items() if " " in k}, {k: v for k, v in options.items() if " " not in k},
            positional)


def _bash(python: str, words: dict[str, Any]) -> str:
    groups, after_command_option, after_option, positional = _split(words)
    skip = "|".join(v for v in words["valued"] if v not in ("--db", "--profile", "-p")) or "--never--"
    ids = "|".join(map(_quote, words["ids"])) or "--never--"
    lines = [
        "_hermes_state() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="" cmd="" action="" key="" db="" profile="" i word words=""',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        word="${COMP_WORDS[i]}"',
        '        case "$word" in',
        '            --db) db="${COMP_WORDS[i+1]}"; i=$((i + 1));;',
        '            --profile|-p) profile="${COMP_WORDS[i+1]}"; i=$((i + 1));;',
        '            --db=*) db="${word#--db=}";;',
        '            --profile=*) profile="${word#--profile=}";;',
        f"            {skip}) i=$((i + 1));;",
        "            -*) ;;",
        '            *) if [[ -z $cmd ]]; then cmd="$word"',
        f"               elif [[ -z $action && \" {' '.join(groups)} \" == *\" $cmd \"* ]]; then action=\"$word\"; fi;;",
        "        esac",
        "    done",
        '    (( COMP_CWORD > 1 )) && prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    key="$cmd${action:+ $action}"',
        '    case "$key $prev" in',
        *_case(after_command_option, "words", "        "),
        "    esac",
        '    case "$prev" in',
        f'        --profile|-p) COMPREPLY=($({_quote(python)} -m hermes_state_complete profiles "$cur" 2>/dev/null)); return;;',
        *_case(after_option, "words", "        "),
        "    esac",
        '    if [[ -n $words ]]; then',
        '        COMPREPLY=($(compgen -W "$words" -- "$cur")); return',
        "    fi",
        '    if [[ $cur == -* ]]; then',
        '        case "$key" in',
        *_case(words["flags"], "words", "            "),
        "        esac",
        f"        COMPREPLY=($(compgen -W {_quote(' '.join(words['globals']))}\" $words\" -- \"$cur\"))",
        "    elif [[ -z $cmd ]]; then",
        f"        COMPREPLY=($(compgen -W {_quote(' '.join(words['commands']))} -- \"$cur\"))",
        '    elif [[ -z $action && -n $cmd ]] && case "$cmd" in',
        *_case(groups, "words", "            "),
        '            *) false;; esac; then',
        '        COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "    else",
        '        case "$key" in',
        *_case(positional, "words", "            "),
        f"            {ids})",
        f"                COMPREPLY=($({_quote(python)} -m hermes_state_complete ids \"$cur\" "
        '${db:+--db "$db"} ${profile:+--profile "$profile"} 2>/dev/null)); return;;',
        "        esac",
        '        if [[ -n $words ]]; then COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        '        else COMPREPLY=($(compgen -f -- "$cur")); fi',
        "    fi",
        "}",
        "complete -o default -F _hermes_state hermes-state",
    ]
    return "\n".join(["# hermes-state completion for bash: eval \"$(hermes-state completion bash)\"",
                      *lines]) + "\n"


def _fish(python: str, words: dict[str, Any]) -> str:
    groups = {name: actions for name, actions in words["commands"].items() if actions}
    lines = ["# hermes-state completion for fish: hermes-state completion fish | source",
             "complete -c hermes-state -f",
             "function __hermes_state_store  # the --db or --profile the line names, for the id lister",
             "    set -l line (commandline -opc)",
             "    for i in (seq (count $line))",
             "        switch $line[$i]",
             "            case --db --profile -p",
             "                if test $i -lt (count $line)",
             "                    echo $line[$i]; echo $line[(math $i + 1)]",
             "                end",
             "            case '--db=*' '--profile=*'",
             "                echo $line[$i]",
             "        end",
             "    end",
             "end",
             f"complete -c hermes-state -n '__fish_use_subcommand' -a {_quote(' '.join(words['commands']))}"]
    for name, actions in groups.items():
        lines.append(f"complete -c hermes-state -n '__fish_seen_subcommand_from {name}; and not "
                     f"__fish_seen_subcommand_from {' '.join(actions)}' -a {_quote(' '.join(actions))}")

    def seen(key: str) -> str:
        return f"__fish_seen_subcommand_from {key.split()[-1]}"

    def option(flag: str) -> str:
        return f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}"
    for key, flags in words["flags"].items():
        for flag in flags:
            values = words["choices"].get(f"{key} {flag}")
            lines.append(f"complete -c hermes-state -n '{seen(key)}' {option(flag)}"
                         + (f" -xa {_quote(' '.join(values))}" if values else ""))
    for key, values in words["choices"].items():
        if not _is_option_choice(key):
            lines.append(f"complete -c hermes-state -n '{seen(key)}' -a {_quote(' '.join(values))}")
    if words["ids"]:
        lines.append(f"complete -c hermes-state -n '__fish_seen_subcommand_from "
                     f"{' '.join(k.split()[-1] for k in words['ids'])}' "
                     f"-a \"({_quote(python)} -m hermes_state_complete ids (commandline -ct) (__hermes_state_store) "
                     "2>/dev/null)\"")
    lines.append(f"complete -c hermes-state -l profile -s p -xa \"({_quote(python)} -m hermes_state_complete profiles "
                 "2>/dev/null)\"")
    for flag in words["globals"]:
        values = words["choices"].get(flag)
        lines.append(f"complete -c hermes-state {option(flag)}" + (" -r" if flag in words["valued"] else "")
                     + (f" -xa {_quote(' '.join(values))}" if values else ""))
    return "\n".join(lines) + "\n"


def script(shell: str, words: dict[str, Any]) -> str:
    """Return the completion script for `shell` (bash, zsh or fish) offering `words`, running this interpreter for the ids."""
    python = sys.executable
    if shell == "bash":
        return _bash(python, words)
    if shell == "zsh":  # zsh runs the bash function through its bash-completion layer
        return ("# hermes-state completion for zsh: eval \"$(hermes-state completion zsh)\"\n"
                "autoload -U +X bashcompinit && bashcompinit\n" + _bash(python, words).split("\n", 1)[1])
    if shell == "fish":
        return _fish(python, words)
    raise ValueError(f"completion is for {', '.join(SHELLS)}, not {shell!r}")


def main(argv: list[str]) -> int:
    """Print the ids for `ids PREFIX [--db PATH] [--profile NAME]`, or the names for `profiles [PREFIX]`; return the exit code."""
    if argv[:1] == ["profiles"]:
        for name in profiles(argv[1] if len(argv) > 1 else ""):
            print(name)
        return 0
    if len(argv) < 2 or argv[0] != "ids":
        print("usage: python -m hermes_state_complete ids PREFIX [--db PATH | --profile NAME] | profiles [PREFIX]",
              file=sys.stderr)
        return 2
    found: dict[str, str] = {}
    rest = argv[2:]
    for i, word in enumerate(rest):
        name, eq, value = word.partition("=")
        name = "--profile" if name == "-p" else name
        if name in ("--db", "--profile"):
            if eq:
                found[name] = value
            elif i + 1 < len(rest):
                found[name] = rest[i + 1]
    for sid in ids(argv[1], found.get("--db"), found.get("--profile")):
        print(sid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
