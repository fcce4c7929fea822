"""Score of `kvgate.evidence.logs` on the field corpus (tests/data/field-logs, issue 23): met/total.

    .venv/bin/python bench/bench_field_logs.py [--misses]

Scans every verbatim excerpt users pasted into public vLLM/SGLang issues and checks each fact
its text proves (engine, version, KV dtype, backend, failed/ready, capacity, findings). Prints
the score per kind of fact and overall; `--misses` lists every unmet expectation.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from field_corpus import load_corpus, score  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--misses", action="store_true", help="list every unmet expectation")
    args = parser.parse_args()
    checks = score()
    met: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for check in checks:
        kind = check.key.split(":")[0]
        total[kind] += 1
        met[kind] += check.met
    for kind in sorted(total):
        print(f"{kind:18} {met[kind]:3}/{total[kind]:3}")
    overall = sum(met.values())
    entries = len(load_corpus())
    print(
        f"{'total':18} {overall:3}/{len(checks):3} = {overall / len(checks):.1%} ({entries} logs)"
    )
    if args.misses:
        for check in checks:
            if not check.met:
                print(
                    f"MISS {check.entry}: {check.key} expected {check.expected!r}, got {check.actual!r}"
                )


if __name__ == "__main__":
    main()
