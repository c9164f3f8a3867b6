"""The distribution: its metadata, its license, and an sdist that carries what its own tests need."""
from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import hermes_state

ROOT = Path(__file__).resolve().parents[1]


def test_metadata_declares_an_spdx_license_the_pythons_tested_and_the_version_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert project["requires-python"] == ">=3.11"
    versions = {c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if c.startswith("Programming Language :: Python :: 3.")}
    assert versions == {"3.11", "3.12", "3.13"}
    assert project["authors"] and "version" not in project and project["dynamic"] == ["version"]


def test_the_sdist_carries_its_tests_fixtures_docs_and_workers(tmp_path):
    built = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta; "
         "print(build_meta.build_sdist(sys.argv[1]))", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    name = built.stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / name) as sdist:
        members = {m.split("/", 1)[1] for m in sdist.getnames() if "/" in m}
        info = sdist.extractfile(f"{name.removesuffix('.tar.gz')}/PKG-INFO").read().decode()
    needed = {"LICENSE", "README.md", "tests/conftest.py", "tests/fixtures/hermes_agent_0.19.0.db.gz",
              "reliability/stress_workers.py", "docs/api.md", "docs/cli.md"}
    needed |= {str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")}
    needed |= {p.name for p in ROOT.glob("hermes_state*.py")}
    assert needed <= members, sorted(needed - members)
    assert not any("__pycache__" in m or m.startswith("bench/results") for m in members)
    assert f"Version: {hermes_state.__version__}\n" in info and "License-Expression: MIT\n" in info
