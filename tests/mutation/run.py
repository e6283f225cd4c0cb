"""`make mutate`: mutmut over each mechanism of tests/mutation/mechanisms.py, one at a time.

    python -m tests.mutation.run                 # every mechanism
    python -m tests.mutation.run batcher writer  # some
    python -m tests.mutation.run --again writer  # only what the last run did not kill
    MUTATE_CHILDREN=2 python -m tests.mutation.run alerts

Each mechanism gets a work directory build/mutation/<name>/ holding links to the packages and
tests/ and a pyproject.toml (this repository's, plus a [tool.mutmut] section naming the files to
mutate and the tests to run), so every mechanism has its own mutmut cache and results. mutmut runs
there with one worker by default (these machines are shared). Afterwards it prints, per
mechanism, generated / killed / survived (equivalent or not) / other, writes the diffs of the
survivors to build/mutation/<name>/survivors.txt, and exits 1 when a mechanism kills fewer than
90% of its mutants or a survivor is not listed as equivalent.

`--again` is for the loop of reading survivors and adding tests: it re-tests the mutants the last
run did not kill (survived, no tests, timed out) and every mutant of a function that has one never
run (an edit renumbered its mutants), and keeps the other verdicts. A killed mutant stays killed
when tests are only added, so the summary then stands for the whole mechanism; after a test was
weakened or removed, or the mutated code changed much, run without `--again`. A change to a
mechanism's `tests` (its mutmut section) makes mutmut forget every verdict: `--again` then re-runs
them all.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.mutation.mechanisms import MECHANISMS, MIN_KILLED_RATIO, PACKAGES, Mechanism, by_name

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "mutation"
# mutmut's exit codes (mutmut.stats.status_by_exit_code): 1 and 3 are kills, 0 a survivor; a
# mutant that hangs the tests past mutmut's CPU limit (36, SIGXCPU) is detected too: counted as
# killed, and shown apart
NOT_MUTATED = (r"\blog\.(debug|info|warning|error|exception)\(",)
KILLED, TIMEOUT, SURVIVED = {1, 3}, {36, -24, 24, 152, 255}, {0}
# a mutant that crashes the test process (SIGABRT, SIGSEGV: a pointer off the slab, say) was
# noticed by it: counted as killed, and shown apart like the timeouts
CRASHED = {-6, -11, 134, 139}
STOPPED = TIMEOUT | CRASHED


@dataclass(frozen=True)
class Outcome:
    mechanism: Mechanism
    statuses: dict[str, int | None]  # mutant name -> mutmut exit code

    @property
    def killed(self) -> list[str]:
        return sorted(k for k, v in self.statuses.items() if v in KILLED | STOPPED)

    @property
    def timed_out(self) -> list[str]:
        return sorted(k for k, v in self.statuses.items() if v in TIMEOUT)

    @property
    def crashed(self) -> list[str]:
        return sorted(k for k, v in self.statuses.items() if v in CRASHED)

    @property
    def survived(self) -> list[str]:
        return sorted(k for k, v in self.statuses.items() if v in SURVIVED)

    @property
    def other(self) -> Counter[int | None]:
        """Timeouts, 'no tests' and the like: neither killed nor a plain survivor."""
        return Counter(v for v in self.statuses.values() if v not in KILLED | STOPPED | SURVIVED)

    @property
    def killed_ratio(self) -> float:
        return len(self.killed) / max(1, len(self.statuses))

    @property
    def unexplained(self) -> list[str]:
        return [k for k in self.survived if k not in self.mechanism.equivalent]


def mutmut_config(mechanism: Mechanism, children_tests: tuple[str, ...]) -> str:
    def toml_list(items: tuple[str, ...] | list[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    return "\n".join(
        [
            "",
            "[tool.mutmut]",
            f"source_paths = {toml_list(list(PACKAGES))}",
            f"only_mutate = {toml_list(mechanism.files)}",
            f"pytest_add_cli_args_test_selection = {toml_list(children_tests)}",
            # torch and the drain/verify threads are not fork-safe from a process that ran tests
            'process_isolation = "forkserver"',
            # log calls say things to people; no test reads them, so they are not mutated
            f"do_not_mutate_patterns = {toml_list(list(NOT_MUTATED))}",
            "use_git_change_detection = false",
            # a mutant that hangs is stopped after (its tests' time + 15 s) x 4 of wall time:
            # mutmut's default (t + 1 s) x 15 makes a hanging mutant of the model-backed tests
            # cost many minutes, and a small constant stops healthy runs of fast tests on a
            # loaded machine (pytest's own start in the worker takes seconds there)
            "timeout_multiplier = 4.0",
            "timeout_constant = 15.0",
            "",
        ]
    )


def prepare(mechanism: Mechanism) -> Path:
    work = WORK / mechanism.name
    work.mkdir(parents=True, exist_ok=True)
    for name in (*PACKAGES, "tests"):
        link = work / name
        if not link.is_symlink():
            link.symlink_to(ROOT / name, target_is_directory=True)
    pyproject = (ROOT / "pyproject.toml").read_text()
    (work / "pyproject.toml").write_text(pyproject + mutmut_config(mechanism, mechanism.tests))
    return work


def module_glob(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".") + ".*"


def function_glob(mutant: str) -> str:
    return mutant.rsplit("__mutmut_", 1)[0] + "__mutmut_*"


def unsettled(statuses: dict[str, int | None]) -> list[str]:
    """What `--again` re-tests: each mutant the last run did not kill (timeouts included: on a
    loaded machine a slow healthy run can be cut off), and every mutant of a function with one
    never run (an edit renumbered its mutants, so the old verdicts name other changes)."""
    fresh = {function_glob(k) for k, v in statuses.items() if v is None}
    named = {k for k, v in statuses.items() if v is not None and v not in KILLED}
    return sorted(fresh | {k for k in named if function_glob(k) not in fresh})


def run_mutmut(mechanism: Mechanism, work: Path, children: int, again: bool = False) -> None:
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children)]
    # naming the mutants makes mutmut test every one again (else it keeps earlier verdicts of
    # unchanged functions, which a test change can invalidate)
    if not again:
        call_mutmut(command + list(mechanism.only or map(module_glob, mechanism.files)), work)
        return
    done: set[str] = set()
    # a second pass catches functions an edit renumbered: mutmut resets their verdicts (None)
    # only when it regenerates the mutants, at the start of the first pass
    for _ in range(2):
        names = [n for n in unsettled(read_statuses(mechanism, work)) if n not in done]
        if not names:
            break
        call_mutmut(command + names, work)
        done.update(names)


def call_mutmut(command: list[str], work: Path) -> None:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    log = work / "mutmut.log"
    print(f"== {work.name}: {' '.join(command[1:])}  (in {work}, output in {log})", flush=True)
    with log.open("w") as out:  # mutmut's progress spinner: thousands of lines
        subprocess.run(command, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)


def read_statuses(mechanism: Mechanism, work: Path) -> dict[str, int | None]:
    statuses: dict[str, int | None] = {}
    for path in mechanism.files:
        meta = work / "mutants" / f"{path}.meta"
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
        for name, code in codes.items():
            if not mechanism.only or any(fnmatch.fnmatch(name, g) for g in mechanism.only):
                statuses[name] = code
    return statuses


def write_survivors(outcome: Outcome, work: Path) -> Path:
    out = work / "survivors.txt"
    parts = []
    for name in outcome.survived:
        diff = subprocess.run(
            [sys.executable, "-m", "mutmut", "show", name],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        why = outcome.mechanism.equivalent.get(name, "NOT LISTED AS EQUIVALENT")
        parts.append(f"## {name}\n# {why}\n{diff}\n")
    out.write_text("".join(parts))
    return out


def summary_line(o: Outcome) -> str:
    num_equivalent = len(o.survived) - len(o.unexplained)
    other = ", ".join(f"{n} exit {code}" for code, n in sorted(o.other.items(), key=str)) or "0"
    return (
        f"{o.mechanism.name:<13} generated {len(o.statuses):>4}  killed {len(o.killed):>4} "
        f"(of which timeouts {len(o.timed_out)}, crashes {len(o.crashed)})  "
        f"survived {len(o.survived):>3} "
        f"(equivalent {num_equivalent}, not {len(o.unexplained)})  other outcomes {other}  "
        f"killed {o.killed_ratio:.1%}"
    )


def main(argv: list[str]) -> int:
    again = "--again" in argv
    names = [a for a in argv if a != "--again"]
    chosen = [by_name(n) for n in names] if names else list(MECHANISMS)
    children = int(os.environ.get("MUTATE_CHILDREN", "1"))
    outcomes = []
    for mechanism in chosen:
        work = prepare(mechanism)
        run_mutmut(mechanism, work, children, again=again)
        outcome = Outcome(mechanism, read_statuses(mechanism, work))
        print(f"   survivors: {write_survivors(outcome, work)}", flush=True)
        outcomes.append(outcome)
    print()
    failed = False
    for o in outcomes:
        print(summary_line(o))
        for name in o.unexplained:
            print(f"    survivor not listed as equivalent: {name}")
        failed |= o.killed_ratio < MIN_KILLED_RATIO or bool(o.unexplained) or not o.statuses
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
