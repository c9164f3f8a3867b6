"""Every public name of each hermes-agent release is here, and every parameter its methods accept.

For each release (0.19.0 and 0.20.1, tests/agent_releases.py), `dir()` of its `hermes_state`
module and of its `SessionDB`, read in its own interpreter, minus underscore names and module
objects (its standard-library and third-party imports, such as `os` or `psutil`), must be a
subset of this library's. For every function and method both have, each parameter the agent's
signature accepts must be accepted here by name, and positionally where the agent takes it so (a
keyword-only parameter here is fine only for one 0.19.0 did not have). Positions are not compared.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import subprocess
from typing import Any

import pytest

import hermes_state
from agent_releases import AGENT_019, AGENT_020, PENDING, Release
from hermes_state import SessionDB

pytestmark = pytest.mark.hermes_agent

# Parameters this check finds refused here, each listed exactly (the test fails if one is fixed and
# still listed, or a new one appears). They predate this check: 0.19.0 takes them positionally where
# this library made them keyword-only, or names them differently.
PENDING_PARAMETERS: set[str] = {
    # found by this check, not yet owned
    'SessionDB.import_sessions: sessions',
    'SessionDB.search_messages: sort (positional there)',
    'SessionDB.update_token_counts: absolute (positional there)',
    'SessionDB.update_token_counts: actual_cost_usd (positional there)',
    'SessionDB.update_token_counts: api_call_count (positional there)',
    'SessionDB.update_token_counts: billing_base_url (positional there)',
    'SessionDB.update_token_counts: billing_mode (positional there)',
    'SessionDB.update_token_counts: billing_provider (positional there)',
    'SessionDB.update_token_counts: cost_source (positional there)',
    'SessionDB.update_token_counts: cost_status (positional there)',
    'SessionDB.update_token_counts: estimated_cost_usd (positional there)',
    'SessionDB.update_token_counts: model (positional there)',
    'SessionDB.update_token_counts: pricing_version (positional there)',
}

# Run in the agent's interpreter: its public names, and each function's and method's parameters.
PROBE = r"""
import inspect, json, types, hermes_state as h

def params(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name] for p in sig.parameters.values()]

def public(owner):
    return [n for n in dir(owner) if not n.startswith("_") and not isinstance(getattr(owner, n), types.ModuleType)]

out = {"module": public(h), "SessionDB": public(h.SessionDB), "signatures": {"module": {}, "SessionDB": {}}}
for n in out["module"]:
    if inspect.isfunction(getattr(h, n)):
        out["signatures"]["module"][n] = params(getattr(h, n))
for n in out["SessionDB"]:
    value = inspect.getattr_static(h.SessionDB, n)
    if callable(getattr(h.SessionDB, n)) and not isinstance(value, type):
        out["signatures"]["SessionDB"][n] = params(getattr(h.SessionDB, n))
print(json.dumps(out))
"""


@functools.lru_cache(maxsize=None)
def names_of(release: Release) -> dict[str, Any]:
    release.require()
    proc = subprocess.run([str(release.python), "-c", PROBE], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=""), cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _ours(owner: Any, name: str) -> list[list[str]] | None:
    try:
        return [[p.name, p.kind.name] for p in inspect.signature(getattr(owner, name)).parameters.values()]
    except (TypeError, ValueError):
        return None


POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")


def refused(theirs: list[list[str]], mine: list[list[str]], before: set[str]) -> list[str]:
    """Say which of the agent's parameters this library's signature does not accept as the agent does."""
    my_kinds = {name: kind for name, kind in mine}
    keywords = any(kind == "VAR_KEYWORD" for _, kind in mine)
    problems = []
    for name, kind in theirs:
        if kind in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            if kind not in my_kinds.values():
                problems.append(f"*{name}" if kind == "VAR_POSITIONAL" else f"**{name}")
            continue
        mine_kind = my_kinds.get(name)
        if kind in POSITIONAL:
            if mine_kind in POSITIONAL:
                continue
            if name in before or (mine_kind is None and not keywords):
                problems.append(f"{name} (positional there)" if mine_kind or keywords else name)
        elif mine_kind is None and not keywords or mine_kind == "POSITIONAL_ONLY":
            problems.append(name)
    return problems


@pytest.mark.parametrize("release", [AGENT_019, AGENT_020], ids=lambda r: r.version)
def test_every_public_name_of_the_release_is_here(release):
    names = names_of(release)
    for part, owner in (("module", hermes_state), ("SessionDB", SessionDB)):
        assert len(names[part]) > 20
        missing = set(names[part]) - set(dir(owner))
        assert missing - PENDING[part] == set(), f"{release.spec}: {part} names missing here: {sorted(missing - PENDING[part])}"


def test_pending_names_are_only_names_still_missing():
    # The set must not hide a name that has landed, nor one 0.20.1 does not have.
    names = names_of(AGENT_020)
    for part, owner in (("module", hermes_state), ("SessionDB", SessionDB)):
        assert PENDING[part] <= set(names[part]), sorted(PENDING[part] - set(names[part]))
        landed = PENDING[part] & set(dir(owner))
        assert landed == set(), f"{part}: these have landed, take them out of PENDING: {sorted(landed)}"


@pytest.mark.parametrize("release", [AGENT_019, AGENT_020], ids=lambda r: r.version)
def test_every_parameter_the_release_accepts_is_accepted_here(release):
    names, older = names_of(release), names_of(AGENT_019)
    problems = []
    for part, owner in (("module", hermes_state), ("SessionDB", SessionDB)):
        for name, theirs in sorted(names["signatures"][part].items()):
            if theirs is None or name not in dir(owner):
                continue
            mine = _ours(owner, name)
            if mine is None:
                problems.append(f"{part}.{name}: no signature here")
                continue
            before = {p for p, _ in (older["signatures"][part].get(name) or [])}
            for problem in refused(theirs, mine, before):
                problems.append(f"{part}.{name}: {problem}")
    unexpected = sorted(set(problems) - PENDING_PARAMETERS)
    assert unexpected == [], f"{release.spec}: parameters not accepted here:\n" + "\n".join(unexpected)


def test_pending_parameters_are_only_those_still_refused():
    problems = set()
    for release in (AGENT_019, AGENT_020):
        names, older = names_of(release), names_of(AGENT_019)
        for part, owner in (("module", hermes_state), ("SessionDB", SessionDB)):
            for name, theirs in names["signatures"][part].items():
                mine = _ours(owner, name) if theirs is not None and name in dir(owner) else None
                if theirs is not None and mine is not None:
                    before = {p for p, _ in (older["signatures"][part].get(name) or [])}
                    problems.update(f"{part}.{name}: {problem}" for problem in refused(theirs, mine, before))
    fixed = sorted(PENDING_PARAMETERS - problems)
    assert fixed == [], f"these are accepted now, take them out of PENDING_PARAMETERS: {fixed}"
