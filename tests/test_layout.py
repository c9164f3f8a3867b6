"""The import graph is one-way (STYLE.md): lower modules never import higher ones."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Rank of each module: a module may import only modules of a strictly lower rank.
RANKS = {
    "hermes_state_errors": 0,
    "hermes_state_common": 1,
    "hermes_state_writer": 2, "hermes_state_lockowners": 2, "hermes_state_home": 2, "hermes_state_provider": 2,
    "hermes_state_lineage": 2,
    "hermes_state_schema": 3, "hermes_state_fts": 3,
    "hermes_state_sessions": 4,
    "hermes_state_messages": 5,
    "hermes_state_conversation": 6, "hermes_state_search": 6,
    "hermes_state_compression": 7,
    "hermes_state_portability": 8, "hermes_state_recovery": 8, "hermes_state_gateway": 8,
    "hermes_state": 9,
    # Consumers of the facade, not layers of it.
    "hermes_state_cli": 10, "hermes_state_pytest": 10,
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


def test_modules_stay_focused():
    for path in ROOT.glob("hermes_state*.py"):
        assert len(path.read_text().splitlines()) <= 900, path.name
