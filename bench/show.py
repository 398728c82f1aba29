"""``python -m bench.show BENCH.json ...``: the tables of finished benchmarks, from their JSON.

For each file: one line per configuration with its repeats side by side (REJECTED, cut or errors
flagged), the replicas' numbers when there were replicas, and the highest rate within the TTFT SLO.
bench/gpu.sh prints this last, so the device call's output ends with every run in short.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

from bench.report import ReplicaWindow, RunSummary, app_table, replica_table, table


def summaries_from(body: dict) -> list[RunSummary]:
    """The RunSummary objects of a bench.json (JSON nulls back to NaN where a float belongs)."""
    names = {f.name: f for f in dataclasses.fields(RunSummary)}
    out = []
    for run in body.get("runs", []):
        values = {}
        for name, value in run.items():
            if name not in names:
                continue
            if name == "replicas":
                value = tuple(ReplicaWindow(**{k: v for k, v in r.items()
                                               if k in {f.name for f in dataclasses.fields(ReplicaWindow)}})
                              for r in value or ())
            elif value is None and names[name].type == "float":  # a NaN written as null
                value = math.nan
            values[name] = value
        out.append(RunSummary(**values))
    return out


def show(path: Path) -> str:
    body = json.loads(path.read_text(encoding="utf-8"))
    runs = summaries_from(body)
    config = body.get("config", {})
    lines = [f"## {path.parent.name}/{path.name}: {len(runs)} runs, {config.get('wall_s', '?')} s, "
             f"paths {config.get('paths')}, modes {config.get('modes')}" +
             (f", label {config['label']!r}" if config.get("label") else "")]
    if body.get("skipped"):
        lines.append(f"skipped (deadline): {'; '.join(body['skipped'])}")
    lines.append(table(runs))
    if replicas := replica_table(runs):
        lines += ["", replicas]
    if app := app_table(runs):
        lines += ["", app]
    for key, rate in (body.get("max_rate_within_slo") or {}).items():
        lines.append(f"highest rate with p99 TTFT <= {body.get('ttft_slo_ms')} ms, every run passing, {key}: {rate}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m bench.show BENCH.json ...", file=sys.stderr)
        return 2
    for name in argv:
        path = Path(name)
        if not path.exists():
            print(f"## {name}: missing (the benchmark wrote no JSON; see its log)")
            continue
        print(show(path))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
