"""Keep each benchmark run: appended to bench/results/<date>[-<kind>].json, the record behind docs/performance.md."""
from __future__ import annotations

import datetime
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def save_run(result: dict, kind: str = "") -> Path:
    """Append `result` to the day's results file (the day it started, UTC); return the file's path."""
    started = result.get("started_utc") or datetime.datetime.now(datetime.timezone.utc).isoformat()
    out = RESULTS / f"{started[:10]}{'-' + kind if kind else ''}.json"
    RESULTS.mkdir(exist_ok=True)
    record = json.loads(out.read_text()) if out.exists() else {}
    record.setdefault("runs", []).append(result)
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return out
