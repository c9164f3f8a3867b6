"""The layout: the declared layers, no import cycle, no reaching into another module's privates, every module said and shipped."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def declared_layers() -> tuple[list[str], dict[str, str]]:
    """Return the layers from the bottom up and each module's layer, as docs/architecture.md declares them."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text[text.index("## Layers and modules"):]
    section = section[:section.index("\n## ", 5)]
    layers = re.findall(r"^\| (\w+) \| [^|`]", section, re.M)
    layers = [name for name in layers if name not in ("layer", "module")]
    modules = dict(re.findall(r"^\| `(hermes_state\w*)\.py` \| (\w+) \|", section, re.M))
    return layers, modules


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return {m for m in found if m == "hermes_state" or m.startswith("hermes_state_")}


def test_every_module_is_in_one_declared_layer():
    layers, modules = declared_layers()
    assert layers == ["ground", "engine", "records", "features", "facade", "programs"]
    assert set(modules) == {p.stem for p in ROOT.glob("hermes_state*.py")}
    assert set(modules.values()) <= set(layers), set(modules.values()) - set(layers)


def test_imports_stay_in_their_layer_or_point_down():
    layers, modules = declared_layers()
    rank = {name: n for n, name in enumerate(layers)}
    up = [f"{path.stem} ({modules[path.stem]}) imports {target} ({modules[target]})"
          for path in sorted(ROOT.glob("hermes_state*.py")) for target in sorted(_imports(path))
          if rank[modules[target]] > rank[modules[path.stem]]]
    assert up == []


def test_no_two_modules_import_each_other_even_through_others():
    graph = {path.stem: _imports(path) - {path.stem} for path in ROOT.glob("hermes_state*.py")}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module not in done:
            for target in sorted(graph[module]):
                visit(target, (*path, module))
            done.add(module)
    for module in sorted(graph):
        visit(module, ())


# Names with a leading underscore that other modules may import: callers of the original
# design know them by these names.
ALLOWED_PRIVATE_IMPORTS = {"_apply_profile_override", "_reconcile_columns", "_sanitize_fts5_query"}


def test_no_module_imports_another_modules_private_names():
    for path in ROOT.glob("hermes_state*.py"):
        aliases = _aliases(path)  # once per module: parsing it again for each attribute took seconds
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hermes_state"):
                private = {a.name for a in node.names if a.name.startswith("_")} - ALLOWED_PRIVATE_IMPORTS
                assert not private, f"{path.stem} imports {sorted(private)} from {node.module}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and node.value.id in aliases:
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
