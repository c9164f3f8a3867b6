"""Run the project's property-based tests with many more examples than the default suite affords.

    python reliability/fuzz.py [--examples 5000] [pytest arguments, default: every test file with properties]

The suite keeps each property test small (tens to hundreds of examples) so it stays fast. This
runs the same tests (search input that must never raise, hostile ids and titles, random
sequences of writes checked against a model, export/import round trips where present) with
`--examples` each and no deadline, and prints Hypothesis's statistics per test. A failure is
printed with its minimal example, as in the suite.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


class ScaleExamples:
    """pytest plugin: raise max_examples of every collected Hypothesis test."""

    def __init__(self, examples: int):
        self.examples = examples
        self.scaled: list[str] = []

    def pytest_collection_modifyitems(self, items) -> None:
        from hypothesis import settings  # noqa: PLC0415  (after pytest's assertion rewriting is set up)
        for item in items:
            test = getattr(item, "obj", None)
            if getattr(test, "is_hypothesis_test", False):
                # The test's own @settings pin max_examples; Hypothesis reads them from this
                # attribute when the test runs, so layering a copy on top scales it.
                own = getattr(test, "_hypothesis_internal_use_settings", None)
                test._hypothesis_internal_use_settings = settings(own, max_examples=self.examples, deadline=None)
                self.scaled.append(item.nodeid)

    def pytest_collection_finish(self, session) -> None:
        print(f"\n{len(self.scaled)} property tests scaled to {self.examples} examples each")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000)
    args, rest = parser.parse_known_args()
    targets = rest or [str(p) for p in sorted((REPO / "tests").glob("test_*.py")) if "@given" in p.read_text()]
    plugin = ScaleExamples(args.examples)
    return pytest.main(["-p", "no:cacheprovider", "--hypothesis-show-statistics",
                        "--rootdir", str(REPO), *targets], plugins=[plugin])


if __name__ == "__main__":
    sys.exit(main())
