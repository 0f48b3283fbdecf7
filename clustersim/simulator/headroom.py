"""The share of a GPU's memory left free for what the memory model does not count.

The memory model (simulator/memory.py) counts model states, activations and the frameworks' named
buffers, not the CUDA context, cuBLAS workspaces, NCCL's channel buffers or the caching allocator's
fragmentation. Those are a few percent of a GPU or more: PyTorch's reserved memory exceeds the
allocated by 1% on Deep Optimizer States' 7B runs on one H100 (12,698 / 12,573 MB and 15,850 / 15,717
MB) and by 28-59% on the same group's MLP-Offload runs of 40-100B models on four GPUs
(github.com/DataStates/artifacts, deep-optimizer-states/sample-logs and MLP-Offload/logs, the
"memory (MB) | allocated ... reserved" lines after the first iteration), and the CUDA context, which
PyTorch does not count, comes on top. 5% is of that order for a single-GPU run, not a bound.
A rank with less than THIN_HEADROOM free is told its fit is close (memory.thin_headroom_note), and the
interleaved offload keeps resident optimizer state only up to it (offload.plan).
"""

THIN_HEADROOM = 0.05
