"""Where the test suite's time goes, from a real run: each tier's total, each module's, and the
slowest tests.

    .venv/bin/python benchmarks/suite_time.py                 # the README's test command
    .venv/bin/python benchmarks/suite_time.py -m "not e2e and not slow"   # the fast tier only
    .venv/bin/python benchmarks/suite_time.py --json out.json # keep the figures (and compare)
    .venv/bin/python benchmarks/suite_time.py --compare before.json after.json

It runs pytest in this process with the suite's own settings (pyproject.toml: workers,
timeouts) plus the arguments given, records every test's set-up, call and tear-down seconds and
markers, and prints: the wall time (collection apart), each tier's tests and summed seconds
(fast: neither e2e nor slow; slow; e2e), each module's, and the 25 slowest tests. With workers
(pytest-xdist) the summed seconds exceed the wall time: they are what each test cost, wherever
it ran. `--compare` prints two saved runs' modules side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIERS = ("fast", "slow", "e2e")


def tier(markers: set[str]) -> str:
    return "e2e" if "e2e" in markers else "slow" if "slow" in markers else "fast"


class Recorder:
    """A pytest plugin: seconds, outcome and tier per test id (from the markers its reports
    carry, which workers forward too), and the time until the first test ran (collection)."""

    def __init__(self):
        self.tests: dict[str, dict] = {}
        self.started = time.monotonic()
        self.collected = 0.0

    def pytest_runtest_logreport(self, report):
        if not self.tests:
            self.collected = time.monotonic() - self.started
        test = self.tests.setdefault(report.nodeid, {
            "tier": tier(set(report.keywords)), "seconds": 0.0, "outcome": "passed"})
        test["seconds"] += report.duration
        if report.outcome != "passed" and test["outcome"] == "passed":
            test["outcome"] = report.outcome


def module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def summary(tests: dict[str, dict], wall: float, collected: float) -> dict:
    tiers = {t: {"tests": 0, "seconds": 0.0} for t in TIERS}
    modules: dict[str, dict] = defaultdict(lambda: {"tests": 0, "seconds": 0.0})
    for nodeid, test in tests.items():
        for entry in (tiers[test["tier"]], modules[module(nodeid)]):
            entry["tests"] += 1
            entry["seconds"] += test["seconds"]
    return {"wall": wall, "collection": collected, "tiers": tiers, "modules": dict(modules),
            "tests": tests}


def show(result: dict, slowest: int = 25) -> None:
    failed = [n for n, t in result["tests"].items() if t["outcome"] == "failed"]
    print(f"wall {result['wall']:.0f} s ({result['wall'] / 60:.1f} min), collection "
          f"{result['collection']:.0f} s, {len(result['tests'])} tests, {len(failed)} failed")
    print("\n| tier | tests | seconds (summed) |\n|---|---|---|")
    for name, entry in result["tiers"].items():
        print(f"| {name} | {entry['tests']} | {entry['seconds']:.0f} |")
    print("\n| module | tests | seconds |\n|---|---|---|")
    for name, entry in sorted(result["modules"].items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"| {name} | {entry['tests']} | {entry['seconds']:.1f} |")
    print(f"\n{slowest} slowest tests:")
    ranked = sorted(result["tests"].items(), key=lambda kv: -kv[1]["seconds"])[:slowest]
    for nodeid, test in ranked:
        print(f"  {test['seconds']:7.1f} s  {test['tier']:4}  {nodeid}")
    for nodeid in failed:
        print(f"FAILED {nodeid}")


def compare(before: dict, after: dict) -> None:
    """Modules side by side: tests and seconds before and after (a module that moved or is new
    shows a dash on the side that lacks it)."""
    print(f"wall {before['wall']:.0f} s -> {after['wall']:.0f} s\n")
    print("| module | tests before | seconds before | tests after | seconds after |")
    print("|---|---|---|---|---|")
    names = sorted(set(before["modules"]) | set(after["modules"]),
                   key=lambda n: -max(before["modules"].get(n, {}).get("seconds", 0),
                                      after["modules"].get(n, {}).get("seconds", 0)))
    for name in names:
        cells = []
        for side in (before, after):
            entry = side["modules"].get(name)
            cells += [str(entry["tests"]), f"{entry['seconds']:.1f}"] if entry else ["-", "-"]
        print(f"| {name} | {' | '.join(cells)} |")
    for side, label in ((before, "before"), (after, "after")):
        tiers = ", ".join(f"{t} {e['tests']} tests {e['seconds']:.0f} s"
                          for t, e in side["tiers"].items())
        print(f"\n{label}: {tiers}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args, pytest_args = parser.parse_known_args()
    if args.compare:
        compare(*(json.loads(p.read_text()) for p in args.compare))
        return
    import pytest

    recorder = Recorder()
    started = time.monotonic()
    code = pytest.main(["-p", "no:cacheprovider", "-q", "--rootdir", str(REPO),
                        str(REPO / "tests"), *pytest_args], plugins=[recorder])
    result = summary(recorder.tests, time.monotonic() - started, recorder.collected)
    show(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    sys.exit(int(code))


if __name__ == "__main__":
    main()
