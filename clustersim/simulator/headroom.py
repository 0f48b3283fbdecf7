"""The share of a GPU's memory left free for what the memory model does not count.

The memory model (simulator/memory.py) counts model states, activations and the frameworks' named
buffers, not the CUDA context, cuBLAS workspaces, NCCL's channel buffers or the caching allocator's
fragmentation. Those are of the order of a few percent of a GPU: PyTorch's reserved memory exceeds the
allocated by 1% on Deep Optimizer States' 7B run on one H100 and by 28-38% on its 40-100B runs on four
GPUs (github.com/DataStates/artifacts, deep-optimizer-states/sample-logs and MLP-Offload/logs, the
"memory (MB) | allocated ... reserved" lines), and the CUDA context (several hundred MiB) comes on top.
A rank with less than THIN_HEADROOM free is told its fit is close (memory.thin_headroom_note), and the
interleaved offload keeps resident optimizer state only up to it (offload.plan).
"""

THIN_HEADROOM = 0.05
