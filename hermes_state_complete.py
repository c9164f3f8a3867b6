"""Shell completion for `hermes-state`: the scripts for bash, zsh and fish, and the session ids they offer.

Owns: `script(shell)` (what `hermes-state completion SHELL` prints) and `python -m
hermes_state_complete ids PREFIX [--db PATH]`, which the scripts run on each Tab to list the ids
starting with PREFIX. That path imports `sqlite3` and nothing of this library, and opens the file
read-only (`mode=ro`): a Tab press never waits for the library to load, never writes, and never
creates a file.
Does not own: the commands themselves (hermes_state_cli).
"""
from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

COMMANDS = ["sessions", "recover", "backup", "restore", "doctor", "fts", "init", "migrate", "vacuum", "demo",
            "serve", "passwd", "completion"]
ACTIONS = ["list", "show", "search", "export", "import", "rename", "delete", "prune", "stats"]
TAKES_ID = ["show", "rename", "delete", "export"]
FLAGS = ["--db", "--profile", "--json", "--nl", "--csv", "--epoch", "--color", "--debug", "--help", "--version"]
SHELLS = ("bash", "zsh", "fish")
MAX_IDS = 200


def ids(prefix: str, db: str | None = None) -> list[str]:
    """Return the session ids starting with `prefix` in the store (--db, else <HERMES_HOME>/state.db); [] when none can be read."""
    home = os.environ.get("HERMES_HOME") or str(Path.home() / ".hermes")
    path = Path(db).expanduser() if db else Path(home).expanduser() / "state.db"
    if not path.is_file():
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


def _bash(python: str) -> str:
    return f"""# hermes-state completion for bash: eval "$(hermes-state completion bash)"
_hermes_state() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="" action="" db="" i word
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        case "$word" in
            --db) db="${{COMP_WORDS[i+1]}}"; i=$((i + 1));;
            --profile|-p|--color) i=$((i + 1));;
            -*) ;;
            *) if [[ -z $cmd ]]; then cmd="$word"; elif [[ $cmd == sessions && -z $action ]]; then action="$word"; fi;;
        esac
    done
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "{' '.join(FLAGS)}" -- "$cur"))
    elif [[ -z $cmd ]]; then
        COMPREPLY=($(compgen -W "{' '.join(COMMANDS)}" -- "$cur"))
    elif [[ $cmd == sessions && -z $action ]]; then
        COMPREPLY=($(compgen -W "{' '.join(ACTIONS)}" -- "$cur"))
    elif [[ $cmd == completion ]]; then
        COMPREPLY=($(compgen -W "{' '.join(SHELLS)}" -- "$cur"))
    elif [[ $cmd == sessions && " {' '.join(TAKES_ID)} " == *" $action "* ]]; then
        COMPREPLY=($('{python}' -m hermes_state_complete ids "$cur" ${{db:+--db "$db"}} 2>/dev/null))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o default -F _hermes_state hermes-state
"""


def _fish(python: str) -> str:
    seen_action = f"__fish_seen_subcommand_from {' '.join(ACTIONS)}"
    lines = ["# hermes-state completion for fish: hermes-state completion fish | source",
             "complete -c hermes-state -f",
             f"complete -c hermes-state -n '__fish_use_subcommand' -a '{' '.join(COMMANDS)}'",
             f"complete -c hermes-state -n '__fish_seen_subcommand_from sessions; and not {seen_action}' "
             f"-a '{' '.join(ACTIONS)}'",
             f"complete -c hermes-state -n '__fish_seen_subcommand_from completion' -a '{' '.join(SHELLS)}'",
             f"complete -c hermes-state -n '__fish_seen_subcommand_from {' '.join(TAKES_ID)}' "
             f"-a \"('{python}' -m hermes_state_complete ids (commandline -ct) 2>/dev/null)\""]
    lines += [f"complete -c hermes-state -l {flag[2:]}" + (" -r" if flag in ("--db", "--profile", "--color") else "")
              for flag in FLAGS]
    return "\n".join(lines) + "\n"


def script(shell: str) -> str:
    """Return the completion script for `shell` (bash, zsh or fish), running this interpreter for the ids."""
    python = sys.executable.replace("'", "'\\''")
    if shell == "bash":
        return _bash(python)
    if shell == "zsh":  # zsh runs the bash function through its bash-completion layer
        return ("# hermes-state completion for zsh: eval \"$(hermes-state completion zsh)\"\n"
                "autoload -U +X bashcompinit && bashcompinit\n" + _bash(python).split("\n", 1)[1])
    if shell == "fish":
        return _fish(python)
    raise ValueError(f"completion is for {', '.join(SHELLS)}, not {shell!r}")


def main(argv: list[str]) -> int:
    """Print the ids for `ids PREFIX [--db PATH]`; return the exit code."""
    if len(argv) < 2 or argv[0] != "ids":
        print("usage: python -m hermes_state_complete ids PREFIX [--db PATH]", file=sys.stderr)
        return 2
    db = argv[argv.index("--db") + 1] if "--db" in argv[2:-1] else None
    for sid in ids(argv[1], db):
        print(sid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
