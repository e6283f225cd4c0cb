"""Sum up a FASTLLM_TEST_CPU_REPORT folder (tests/fixtures/cpu_report.py): total CPU seconds,
per file and the costliest tests.

    FASTLLM_TEST_CPU_REPORT=/tmp/cpu make test && python -m tools.test_cpu /tmp/cpu
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(folder: Path) -> dict[str, float]:
    times: dict[str, float] = {}
    for path in sorted(folder.glob("*.json")):
        times.update(json.loads(path.read_text()))
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    times = load(args.folder)
    if not times:
        parser.error(f"no report in {args.folder}")
    per_file: dict[str, float] = {}
    for nodeid, seconds in times.items():
        name = nodeid.split("::", 1)[0]
        per_file[name] = per_file.get(name, 0.0) + seconds
    print(f"{len(times)} tests, {sum(times.values()):.0f} CPU s")
    print("\ncostliest files (CPU s):")
    for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{seconds:8.1f}  {name}")
    print("\ncostliest tests (CPU s):")
    for nodeid, seconds in sorted(times.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{seconds:8.1f}  {nodeid}")


if __name__ == "__main__":
    main()
