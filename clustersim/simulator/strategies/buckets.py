"""PyTorch DDP gradient buckets (torch/nn/parallel/distributed.py, reducer.cpp).

Parameters are assigned greedily in reverse order (the order backward produces gradients); a bucket
closes once it holds at least its cap (it may overshoot by one tensor). The first bucket is capped at
1 MiB so communication starts early. A bucket is ready when its last gradient is produced, i.e. when
backward has finished the earliest (in forward order) layer it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.workloads.layers import Layer

MIB = 2**20


@dataclass(frozen=True)
class Bucket:
    index: int
    elements: int
    ready_layer: int  # index of the layer whose backward completes the bucket

    def nbytes(self, bytes_per_element: int) -> float:
        return float(self.elements * bytes_per_element)


def assign_buckets(
    layers: tuple[Layer, ...], bytes_per_element: int, cap_mb: float, first_cap_mb: float
) -> list[Bucket]:
    buckets: list[Bucket] = []
    elements, ready = 0, None
    cap = first_cap_mb * MIB
    for li in reversed(range(len(layers))):
        for size in reversed(layers[li].param_tensors):
            elements += size
            ready = li
            if elements * bytes_per_element >= cap:
                buckets.append(Bucket(len(buckets), elements, ready))
                elements, ready = 0, None
                cap = cap_mb * MIB
    if elements:
        buckets.append(Bucket(len(buckets), elements, ready))
    return buckets
