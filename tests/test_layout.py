"""The layout: a one-way import graph, no reaching into another module's privates, focused modules."""
from __future__ import annotations

import ast
import re
import sqlite3
import warnings
from contextlib import closing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Rank of each module: a module may import only modules of a strictly lower rank.
RANKS = {
    "hermes_state_errors": 0,
    "hermes_state_common": 1,
    "hermes_state_fork": 1.75,  # the fork gate every stretch of the writer's SQLite work passes
    "hermes_state_writer": 2, "hermes_state_render": 2, "hermes_state_lockowners": 2, "hermes_state_home": 2, "hermes_state_provider": 2,
    "hermes_state_cjk": 2, "hermes_state_highlight": 2,
    "hermes_state_lineage": 2,
    "hermes_state_replicas": 2.5,  # whether Litestream replicates a file, from /proc and its folder
    "hermes_state_titles": 2.5,  # the schema builds the unique-title index after freeing repeats
    "hermes_state_schema": 3, "hermes_state_query": 3,
    "hermes_state_fts": 4, "hermes_state_catalogue": 4,
    "hermes_state_sessions": 4,
    "hermes_state_messages": 5,
    "hermes_state_conversation": 6, "hermes_state_search": 6, "hermes_state_listings": 6,
    "hermes_state_compression": 7,
    "hermes_state_telegram": 6.5,  # topic bindings; the unlinked-session list uses the listings' rows
    "hermes_state_portability": 8, "hermes_state_recovery": 8, "hermes_state_gateway": 8,
    "hermes_state_routing": 8.2,  # the delivery ledgers, on the gateway's ledger machinery and epoch
    "hermes_state_maintenance": 8.5,  # deletes what the ledgers (rank 8) describe
    "hermes_state_repair": 8.5,
    "hermes_state_upgrade": 9,
    "hermes_state_methods": 1.5,  # the method table's machinery: imports only common (the lone-surrogate rule)
    "hermes_state_handle": 9.5,  # the handle the table's methods run on (opens through the upgrade)
    "hermes_state": 10,
    # Consumers of the facade, not layers of it.
    "hermes_state_commands": 11, "hermes_state_pytest": 11, "hermes_state_web": 11,
    "hermes_state_auth": 10.6,  # the web pages' logins: imports only errors and home
    "hermes_state_chart": 10.5,  # the web page's usage chart; imports nothing of ours
    "hermes_state_serve": 12,
    "hermes_state_complete": 12,  # imports nothing of ours: a Tab press must not load the library
    "hermes_state_cli": 13,
}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return {m for m in found if m == "hermes_state" or m.startswith("hermes_state_")}


def test_every_module_has_a_rank():
    modules = {p.stem for p in ROOT.glob("hermes_state*.py")}
    assert modules <= set(RANKS), modules - set(RANKS)
    assert {"hermes_state", "hermes_state_errors", "hermes_state_common"} <= modules


def test_imports_point_down_only():
    for path in ROOT.glob("hermes_state*.py"):
        for target in _imports(path):
            assert RANKS[target] < RANKS[path.stem], f"{path.stem} imports {target}"


# Names with a leading underscore that other modules may import: callers of the original
# design know them by these names.
ALLOWED_PRIVATE_IMPORTS = {"_apply_profile_override", "_reconcile_columns", "_sanitize_fts5_query"}
MAX_LINES = 600
# The facade is one line per delegating method (its method table) plus the methods that reshape
# arguments or compose several steps. The common module holds the data dictionary, one line per
# declared column; it grows with the tables, not with logic.
LONGER = {"hermes_state": 450}


def test_no_module_imports_another_modules_private_names():
    for path in ROOT.glob("hermes_state*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hermes_state"):
                private = {a.name for a in node.names if a.name.startswith("_")} - ALLOWED_PRIVATE_IMPORTS
                assert not private, f"{path.stem} imports {sorted(private)} from {node.module}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and node.value.id in _aliases(path):
                assert node.attr in ALLOWED_PRIVATE_IMPORTS, f"{path.stem} uses {node.value.id}.{node.attr}"


def _aliases(path: Path) -> set[str]:
    """Return the names under which `path` imports sibling modules (`import hermes_state_x as y`)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name for a in node.names if a.name.startswith("hermes_state"))
    return names


def test_modules_stay_focused():
    # Cohesion decides where code lives, not length: a long module with one job is fine. What is
    # asserted: each module says in one sentence what it is for.
    for path in sorted(ROOT.glob("hermes_state*.py")):
        summary = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n", 1)[0].split())
        assert summary.endswith(".") and len(summary) > 20, f"{path.name} has no one-line summary"


def test_docs_list_exactly_the_modules_that_exist():
    modules = {p.stem for p in ROOT.glob("hermes_state*.py")}
    for doc in (ROOT / "README.md", ROOT / "docs" / "architecture.md"):
        named = set(re.findall(r"\bhermes_state(?:_[a-z]+)*\b", doc.read_text()))
        named = {n for n in named if not n.endswith("_")}
        assert named <= modules, f"{doc.name} names modules that do not exist: {sorted(named - modules)}"
    listed = set(re.findall(r"`(hermes_state(?:_[a-z]+)*)\.py`", (ROOT / "docs" / "architecture.md").read_text()))
    assert listed == modules, f"docs/architecture.md lists {sorted(listed ^ modules)} wrongly"


def test_packaging_ships_every_module():
    shipped = set(re.findall(r'"(hermes_state[a-z_]*)"', (ROOT / "pyproject.toml").read_text()))
    assert {p.stem for p in ROOT.glob("hermes_state*.py")} <= shipped


# The names with a leading underscore a test may use: the seed's own (above). hermes-agent's names on
# SessionDB are held by its own tests in the conformance ratchet and by the public mapping
# SessionDB.HERMES_AGENT_ALIASES; no test of this project spells one.
STDLIB_NAMES = {"_exit"}  # os._exit: the standard library's documented exit without clean-up


def _private_uses(path: Path) -> list[str]:
    """Return each place in a test module that reaches another module's or an object's underscore name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = None
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            name = node.attr
        elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("setattr", "getattr", "delattr") \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            name = node.args[1].value
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith("_") and a.name not in ALLOWED_PRIVATE_IMPORTS]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and not re.fullmatch(r"[\w.]+", node.value):  # code run in a subprocess, not a name as data
            found += [f"{node.lineno}: {m}" for m in re.findall(r"\b[a-z]\w*\.(_[A-Za-z]\w*)", node.value)
                      if not m.startswith("__") and m not in ALLOWED_PRIVATE_IMPORTS | STDLIB_NAMES]
        if isinstance(name, str) and name.startswith("_") and not name.startswith("__") \
                and name not in ALLOWED_PRIVATE_IMPORTS | STDLIB_NAMES:
            found.append(f"{node.lineno}: {name}")
    return found


def test_no_test_reaches_an_underscore_name_of_another_module_or_of_sessiondb():
    leaks = {p.name: uses for p in sorted((ROOT / "tests").glob("*.py")) if (uses := _private_uses(p))}
    assert not leaks, leaks


# --- the write path ------------------------------------------------------------------------------
# The modules whose code a message write runs, in the order they first run: the method table's
# generated method, the handle that turns its kind into a transaction, the message rows (the transcript guard, the row and its queueing), the data
# dictionary (the value rules) and the writer's transaction. Compression runs only when another
# holder is compressing the session; the errors module only once something failed.
WRITE_PATH = ["hermes_state_methods", "hermes_state_handle", "hermes_state_messages", "hermes_state_common", "hermes_state_writer",
              "hermes_state_fork"]
# The append that fills a batch also runs the batch's statements, and SQLite calls the CJK
# function for the CJK index inside them.
BATCH_PATH = [*WRITE_PATH, "hermes_state_fts", "hermes_state_cjk"]


def _modules_run(call: Any) -> list[str]:
    """Return the library modules whose code runs during `call()`, in the order they first run."""
    import sys
    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        path = Path(frame.f_code.co_filename)
        if event == "call" and path.parent == ROOT and path.stem.startswith("hermes_state") and path.stem not in seen:
            seen.append(path.stem)
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def test_a_message_write_runs_only_the_write_path_modules(tmp_path):
    from hermes_state import SessionDB
    import hermes_state_messages as message_rows
    calls = [("user", ("s", "user", "plain text"), {}), ("cjk", ("s", "user", "東京タワーの検索テスト"), {}),
             ("tool call", ("s", "assistant", None), {"tool_calls": [{"id": "c2", "type": "function", "function": {
                 "name": "calc", "arguments": "{}"}}]}),
             ("tool result", ("s", "tool", "42"), {"tool_call_id": "c2", "tool_name": "calc"}),
             ("unpaired tool result", ("s", "tool", "43"), {"tool_call_id": "c9", "tool_name": "calc"})]
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "warm-up")  # lazy first-use work is not the write path
        for case, args, extra in calls:
            ran = _modules_run(lambda: db.append_message(*args, **extra))
            assert ran == WRITE_PATH, (case, ran)
        rows = db.get_messages("s")
        assert rows[3]["tool_calls"] and rows[4]["tool_call_uid"] == rows[3]["tool_call_uids"]["c2"]  # real writes
        for n in range(len(rows), message_rows.BATCH_ROWS - 1):
            db.append_message("s", "user", f"filler {n}")
        assert db.message_count("s") == message_rows.BATCH_ROWS - 1
        ran = _modules_run(lambda: db.append_message("s", "user", "東京 the batch's last row"))
        assert ran == BATCH_PATH, ran
        # The batch really ran: the queue is empty and the CJK index finds the row.
        with closing(sqlite3.connect(tmp_path / "state.db")) as other:
            assert other.execute("SELECT COUNT(*) FROM messages_fts_pending").fetchone()[0] == 0
        assert db.search_messages("東京")


# McCabe cyclomatic complexity, counted as radon counts it (its ComplexityVisitor), so that
# `radon cc -s -n C hermes_state*.py` and this test agree: 1 per function, plus 1 for each
# `if`/`elif`, ternary, `assert`, `for`/`while` (another 1 for their `else`), each comprehension's
# `for` and each of its `if`s, each `except` handler (another 1 for a `try`'s `else`), each
# `and`/`or` operand after the first, and each `match` case except a bare `case _`. `with`,
# `finally`, `lambda` itself and decorators add nothing. A nested function or class is measured on
# its own, not inside the function that defines it.
MAX_COMPLEXITY = 15


def _complexity(func: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    score = 1
    stack: list[ast.AST] = list(func.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, (ast.If, ast.IfExp, ast.Assert)):
            score += 1
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            score += 1 + bool(node.orelse)
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            score += len(node.handlers) + bool(node.orelse)
        elif isinstance(node, ast.BoolOp):
            score += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            score += 1 + len(node.ifs)
        elif isinstance(node, ast.Match):
            wildcard = any(isinstance(c.pattern, ast.MatchAs) and c.pattern.pattern is None for c in node.cases)
            score += max(0, len(node.cases) - wildcard)
        stack.extend(ast.iter_child_nodes(node))
    return score


def test_complexity_counts_the_documented_constructs():
    source = '''
def f(xs, y):
    if y and xs or not y:          # if 1, and/or 2
        pass
    elif y:                        # 1
        pass
    for x in xs:                   # 1 plus its else 1
        pass
    else:
        pass
    while y:                       # 1
        y = y - 1 if y else 0      # ternary 1
    try:
        pass
    except ValueError:             # 1
        pass
    except KeyError:               # 1
        pass
    else:                          # 1
        pass
    finally:
        pass
    with open(y) as h:             # 0
        pass
    assert xs                      # 1
    [x for x in xs if x if y]      # 1 plus 2 ifs
    match y:
        case 1: pass               # 1
        case 2: pass               # 1
        case _: pass               # 0
    def inner():                   # measured on its own
        if y:
            pass
'''
    func = ast.parse(source).body[0]
    assert _complexity(func) == 1 + 3 + 1 + 2 + 1 + 1 + 3 + 0 + 1 + 3 + 2
    inner = func.body[-1]
    assert _complexity(inner) == 2


def test_no_library_function_is_too_complex():
    found = []
    for path in sorted(ROOT.glob("hermes_state*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _complexity(node) > MAX_COMPLEXITY:
                found.append(f"{path.name}:{node.lineno} {node.name} ({_complexity(node)})")
    assert found == [], "split these by responsibility into smaller named functions:\n" + "\n".join(found)
