"""How well `calibrate model` predicts a micro-batch it did not fit, on this machine's CPU.

Two small transformers (a 2-layer BERT-style encoder and a 4-layer GPT-style decoder, defined below
as a user catalog) are timed at micro-batches 2, 4 and 8 with 6 held out, one torch thread,
``--repeats`` times each; printed: every held-out error (predicted / measured step - 1) and the
median and largest |error|. The target is 5% (docs/gpu-compute.md).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_calibrate_model.py [--repeats 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

CATALOG = """
Bench-BERT:
  family: transformer
  description: two-layer BERT-style encoder
  layers: 2
  hidden: 128
  heads: 4
  ffn: 512
  vocab: 2000
  max_positions: 128
  token_types: 2
  style: bert
  default_seq_len: 64
Bench-GPT:
  family: transformer
  description: four-layer GPT-style decoder
  layers: 4
  hidden: 256
  heads: 8
  ffn: 1024
  vocab: 4000
  max_positions: 256
  style: gpt
  default_seq_len: 64
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    from clustersim.calibration.model_calibration import ModelChoice, calibrate_model
    from clustersim.catalog import user_catalogs

    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        catalog = Path(tmp) / "bench.yaml"
        catalog.write_text(CATALOG)
        with user_catalogs([catalog]):
            for i in range(args.repeats):
                for name in ("Bench-BERT", "Bench-GPT"):
                    profile, _ = calibrate_model(
                        ModelChoice(catalog=name), "cpu", [2, 4, 8], 6, None, "fp32", "sdpa", "adamw",
                        args.steps, 3, Path(tmp) / f"p{i}.json", threads=1,
                    )  # fmt: skip
                    h = profile.model_compute[-1].holdout
                    errors.append(h.rel_error)
                    print(
                        f"{name} run {i + 1}: micro-batch {h.micro_batch} measured "
                        f"{h.measured_s * 1e3:.2f} ms, predicted {h.predicted_s * 1e3:.2f} ms "
                        f"({100 * h.rel_error:+.1f}%)",
                        flush=True,
                    )
    abs_errors = [abs(e) for e in errors]
    print(
        f"median |error| {100 * statistics.median(abs_errors):.1f}%, max {100 * max(abs_errors):.1f}% "
        f"over {len(errors)} runs"
    )


if __name__ == "__main__":
    main()
