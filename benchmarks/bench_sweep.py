"""Time a 1,000-row sweep of BERT-Large scenarios up to 1,024 GPUs on the in-process Dask cluster.

taskset -c 0,1 .venv/bin/python benchmarks/bench_sweep.py
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import yaml

from clustersim.sweeps.run import run_sweep
from clustersim.sweeps.spec import load_sweep

SWEEP = {
    "name": "bench-1000",
    "base": "preset:default",
    "vary": {
        "gpus": [8, 16, 32, 64, 128, 256, 512, 1024],  # 8
        "nic_gbps": [10, 25, 40, 100, 200],  # 5
        "optimizer": ["adam", "onebit-adam", "zero-one-adam", "binsgdm", "sgdm"],  # 5
        "micro_batch": [8, 16, 32, 64, 128],  # 5 -> 1,000 rows
    },
    "steps": 100000,
}


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    try:
        (tmp / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
        sweep = load_sweep(tmp / "sweep.yaml")
        t0 = time.perf_counter()
        counts = run_sweep(sweep, tmp / "out")
        wall = time.perf_counter() - t0
        print(
            f"{counts['written']} rows in {wall:.1f} s ({1000 * wall / max(counts['written'], 1):.1f} "
            "ms per row)"
        )
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
