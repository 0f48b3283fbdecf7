"""Old-vs-new timing on a shared, loaded machine: ratios measured in one benchmark run, interleaved.

Absolute times on a 2-vCPU machine that other jobs share drift by 2x within minutes, so a benchmark
here never compares against a number measured earlier. It extracts a baseline commit's ``clustersim``
(``git archive``) into a temporary folder and starts two worker processes, one importing the baseline
and one the working tree, and times pairs of runs: one old run and one new run back to back (which
goes first alternates). The ratio old/new is taken per pair, so a busy moment slows both sides of
the same ratio. Reported: the median time of each side, and the median of the per-pair ratios with
its spread (10th-90th percentile).

A case is a function in benchmarks/cases.py that both versions can run (public API only).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# The code before the speed work of issue #15; golden outputs (tests/data) were recorded with it.
DEFAULT_BASELINE = "70036b7"


def extract(ref: str) -> Path:
    """``clustersim/`` of ``ref`` in a temporary folder (delete it with shutil.rmtree)."""
    tmp = Path(tempfile.mkdtemp(prefix="clustersim-baseline-"))
    archive = subprocess.run(["git", "archive", ref, "clustersim"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    return tmp


class Worker:
    """A process that imports clustersim from ``path`` (None: the working tree) and runs cases."""

    def __init__(self, path: Path | None):
        env = dict(os.environ)
        # the working tree first too: an installed clustersim (an editable install of another checkout)
        # would otherwise be the "new" side
        env["PYTHONPATH"] = os.pathsep.join((str(path or ROOT), str(HERE)))
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "cases.py"), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(path or ROOT),
        )
        self.where = self.ask({"cmd": "where"})["file"]

    def ask(self, msg: dict) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker died on {msg}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


@dataclass
class Comparison:
    case: str
    old_s: list[float]  # per pair: seconds of one run
    new_s: list[float]
    old_info: dict
    new_info: dict

    @property
    def ratios(self) -> list[float]:
        return [o / n for o, n in zip(self.old_s, self.new_s)]

    def spread(self) -> tuple[float, float]:
        """10th and 90th percentile of the per-pair ratios."""
        q = statistics.quantiles(self.ratios, n=10, method="inclusive")
        return q[0], q[-1]

    def line(self, width: int = 34) -> str:
        old, new = statistics.median(self.old_s), statistics.median(self.new_s)
        lo, hi = self.spread()
        return (
            f"{self.case:<{width}}{_ms(old):>10}{_ms(new):>10}{statistics.median(self.ratios):>8.2f}x"
            f"  [{lo:.2f}-{hi:.2f}]" + _events(self.old_info, old) + _events(self.new_info, new)
        )


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}" if s < 10 else f"{s:.1f} s"


def _events(info: dict, seconds: float) -> str:
    if not info.get("events"):
        return ""
    ev, ops = info["events"], max(info.get("ops", 0), 1)
    per = f"{seconds / ev * 1e6:5.1f} us/ev {seconds / ops * 1e6:5.1f} us/op"
    return f" | {ops:>5} ops {ev / ops:4.1f} ev/op {per}"


HEADER = (
    f"{'case':<34}{'old ms':>10}{'new ms':>10}{'old/new':>9}  [p10-p90]"
    "  | old: ops simulated, simpy events per op, run time per event and per op | new: the same"
)


class AB:
    """Both workers, started once for a benchmark run."""

    def __init__(self, baseline: str = DEFAULT_BASELINE):
        self.baseline = baseline
        self.tree = extract(baseline)
        self.old = Worker(self.tree)
        self.new = Worker(None)
        if self.old.where == self.new.where:
            raise RuntimeError(f"both workers import clustersim from {self.old.where}")

    def compare(self, case: str, pairs: int, arg=None, label: str = "", warm: bool = True) -> Comparison:
        """``pairs`` pairs of runs, one old and one new back to back (which first alternates); ``warm``:
        one untimed run of each first (beyond the untimed run that checks both give the same result)."""
        info = {"cmd": "info", "case": case, "arg": arg}
        old_info, new_info = self.old.ask(info), self.new.ask(info)
        if not math.isclose(old_info["result"], new_info["result"], rel_tol=1e-9):
            # tests/test_golden.py is what guarantees identical outputs; a prediction changed on purpose
            # since the baseline (e.g. the CPU Adam default of the offload cases) is timed, and said so
            print(
                f"note: {case} {arg!r}: result {new_info['result']:.6g} differs from the baseline's "
                f"{old_info['result']:.6g} (a prediction changed on purpose since; see tests/golden.py)",
                file=sys.stderr,
            )
        msg = {"cmd": "time", "case": case, "arg": arg, "repeat": 1}
        for w in (self.old, self.new) if warm else ():  # the first timed run fills caches in both
            w.ask(msg)
        old_s, new_s = [], []
        for i in range(pairs):
            pair = (self.old, self.new) if i % 2 == 0 else (self.new, self.old)
            for w in pair:
                (old_s if w is self.old else new_s).append(w.ask(msg)["best_s"])
        return Comparison(label or case, old_s, new_s, old_info, new_info)

    def close(self) -> None:
        self.old.close()
        self.new.close()
        shutil.rmtree(self.tree, ignore_errors=True)
