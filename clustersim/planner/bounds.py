"""Lower bounds on a plan candidate's step time and cost, from no simulation: what lets `plan` skip the
candidates that cannot win before simulating them.

A step cannot take less than its compute: every forward and backward kernel of the model for the step's
samples, at the device's rates (the same cost model the simulation prices them with), spread evenly over
the tensor x pipeline ranks of one data-parallel replica. The simulation only adds to that: host dispatch
where it is slower, exposed communication, a pipeline's bubble, the optimizer's update. Two assumptions
keep it a bound, and COMPUTE_BOUND_MARGIN keeps a margin for them: a tensor-parallel rank's share of a
layer takes at least 1/t of the whole layer's time (split GEMMs are smaller, never more efficient per
FLOP in the roofline model), and a halved micro-batch (fit_micro_batch) is no faster per sample.
"""

from __future__ import annotations

from clustersim.catalog import model
from clustersim.errors import InputError
from clustersim.scenario import Scenario

# The bound is scaled by this before it is used to prune: a candidate is skipped only when even 80% of
# its compute-only time could not win. Measured with the margin: 9-75% of the simulated step on the
# GPT-3 175B plan's 276 candidates, 24-80% on GPT-3 1.3B's 224 and 5-39% on BERT-Large's 224.
COMPUTE_BOUND_MARGIN = 0.8


def step_time_lower_bound(scenario: Scenario, profile=None) -> float:
    """Seconds one step takes at least (module docstring), times COMPUTE_BOUND_MARGIN; 0.0 where no bound
    is known (measured phases, or ranks that each hold a share of every layer other than by tensor x
    pipeline parallelism). A pipeline adds its bubble: with m micro-batches, p stages and v chunks per
    stage the step is at least (m + (p - 1)/v) passes of its average stage (Narayanan et al. SC'21,
    sec. 2.2), and full recomputation runs the forward again before each backward."""
    par = scenario.training.parallelism
    per_micro_batch = _micro_batch_compute(scenario, profile)
    if per_micro_batch is None:
        return 0.0
    forward, backward, params = per_micro_batch
    if scenario.workload.activation_checkpointing:
        backward += forward
    elif par.recompute == "full":  # the recomputed share of the blocks (recompute_num_layers, method block)
        backward += forward * _recomputed_share(scenario)
    # The row may run at a smaller micro-batch (fit_micro_batch halves it while memory is short), whose
    # bubble is smaller: the bubble is counted at micro-batch 1, where it is least, and every sample at
    # this micro-batch's rate, which a smaller one does not beat.
    mb = scenario.workload.micro_batch
    samples = mb * scenario.workload.gradient_accumulation
    passes = samples + (par.pipeline - 1) / (par.virtual_stages if par.schedule == "interleaved" else 1)
    compute = (forward + backward) / mb * passes / (par.tensor * par.pipeline)
    if scenario.training.megatron_program:  # its exchange runs after the last backward
        return COMPUTE_BOUND_MARGIN * (compute + _megatron_gradient_sync(scenario, params))
    return COMPUTE_BOUND_MARGIN * max(compute, _data_parallel_exchange(scenario, params))


def _bytes_per_element(scenario: Scenario) -> tuple[int, int]:
    """Bytes of an exchanged gradient and of a gathered parameter (simulator.context's grad_bytes and
    element_bytes)."""
    from clustersim.catalog import BYTES_PER_ELEMENT, storage_precision

    stored = storage_precision(scenario.workload.precision)
    return BYTES_PER_ELEMENT[scenario.training.gradient_dtype or stored], BYTES_PER_ELEMENT[stored]


def _recomputed_share(scenario: Scenario) -> float:
    """The share of a chunk's blocks full recomputation runs again: all of them, or with
    recompute_method block the first recompute_num_layers of each chunk's blocks."""
    par = scenario.training.parallelism
    if par.recompute_num_layers is None or par.recompute_method == "uniform" or not scenario.workload.model:
        return 1.0
    per_chunk = model(scenario.workload.model).layers // (par.pipeline * par.virtual_stages)
    return min(par.recompute_num_layers, per_chunk) / per_chunk


def _megatron_gradient_sync(scenario: Scenario, params: float) -> float:
    """Seconds of a Megatron layout's data-parallel gradient exchange at least, which its program runs
    after the last backward (not overlapped). The data-parallel group of a rank spans n nodes, k of its
    members on each, and s such groups share a node's NICs (model_parallel.Layout.data_group: Megatron's
    rank order, tensor fastest, then data). Whatever the algorithm, a node must send the other n - 1
    nodes what they lack of each group's shard, (n-1)/n of its bytes, for the reduce-scatter of the
    gradients and again for the all-gather of the weights (the distributed optimizer) or of the reduced
    gradients (the two halves of an all-reduce): the bandwidth-optimal bound (Patarasuk and Yuan, JPDC
    2009), no in-network reduction modelled. The critical (first) stage syncs last, when the node's other
    stages are done, so only its groups are counted; 0 where the group stays inside a node."""
    from clustersim.simulator.model_parallel import Layout
    from clustersim.topologies.node import nic_bandwidth

    c, par = scenario.cluster, scenario.training.parallelism
    ranks = par.tensor * par.pipeline
    if c.nic.count < 1 or c.world_size % ranks or c.world_size // ranks < 2:
        return 0.0
    shape = Layout.data_group_shape(par.tensor, c.world_size // ranks, c.gpus_per_node)
    if shape.nodes < 2:
        return 0.0
    grad, weights = _bytes_per_element(scenario)
    if not par.distributed_optimizer:
        weights = grad
    shard = params / ranks * (grad + weights)  # a rank's share of its stage, both directions' worth
    return shape.sharing * shard * (shape.nodes - 1) / shape.nodes / (c.nic.count * nic_bandwidth(c))


def _data_parallel_exchange(scenario: Scenario, params: float) -> float:
    """Seconds a data-parallel step's gradient exchange takes at least on the NICs, for the optimizers
    that send their gradients whole (Adam, SGD-momentum: the compressed ones send fewer bytes) over
    DeepSpeed's ZeRO or plain DDP across the whole world: each node sends the other n - 1 nodes (n-1)/n
    of the model's gradient bytes (reduce-scatter) and of its parameters' or reduced gradients' bytes
    (all-gather), as _megatron_gradient_sync argues; a ZeRO-3 step gathers its parameters twice in
    every micro-step instead (below). The exchange may overlap compute, so it bounds the step alongside
    the compute, not on top of it. 0 where it is not known to hold (tensor-sharded
    layouts, FSDP's hybrid sharding inside a node, one node)."""
    from clustersim.topologies.node import nic_bandwidth

    c, t = scenario.cluster, scenario.training
    if (
        t.optimizer not in ("adam", "sgdm")
        or t.parallelism.model_parallel
        or t.sharding.framework != "deepspeed"
        or c.nodes < 2
        or c.nic.count < 1
    ):
        return 0.0
    grad, weights = _bytes_per_element(scenario)
    per_byte = (c.nodes - 1) / c.nodes / (c.nic.count * nic_bandwidth(c))  # seconds per byte of the model
    sh = t.sharding
    if sh.stage == 3 and not (sh.zeropp.enabled or sh.partition.enabled or t.offload.mode != "none"):
        # ZeRO-3 (strategies/zero.py _stage3_program) all-gathers every layer's parameters over the world
        # in each micro-step's forward and again in its backward, on its gather stream, and
        # reduce-scatters the micro-step's gradients on the comm stream: each stream's collectives run
        # one after another, but the two streams may overlap, so the larger of the two bounds the step.
        micro_steps = scenario.workload.gradient_accumulation  # a halved micro-batch only adds steps
        return micro_steps * params * max(2 * weights, grad) * per_byte
    if not sh.enabled:
        weights = grad  # an all-reduce: both halves carry gradients
    return params * (grad + weights) * per_byte


_COMPUTE: dict[str, tuple[float, float, float] | None] = {}


def _micro_batch_compute(scenario: Scenario, profile) -> tuple[float, float, float] | None:
    """Forward and backward device seconds of the whole model for one micro-batch (every rank's share
    together) and its parameters, cached by what they depend on: the GPU, the workload, the layout
    and the profile."""
    from clustersim.simulator.context import build_context

    par = scenario.training.parallelism
    workload = scenario.workload.model_dump(exclude={"gradient_accumulation", "activation_checkpointing"})
    key = repr((scenario.cluster.gpu, workload, par, profile, scenario.profile))
    if key not in _COMPUTE:
        try:
            ctx = build_context(scenario, profile)
        except InputError:
            ctx = None
        if ctx is None or ctx.tensor_sharded or ctx.phases is not None:
            _COMPUTE[key] = None
        else:
            layers = ctx.workload.layers
            if ctx.model_parallel:  # the kernels a Megatron rank runs (its fused ones), all t ranks' worth
                t = par.tensor
                fwd = t * sum(ctx.rank_forward_time(layer) for layer in layers)
                bwd = t * sum(ctx.rank_backward_time(layer) for layer in layers)
            else:
                fwd = sum(ctx.forward_time(layer) for layer in layers)
                bwd = sum(ctx.backward_time(layer) for layer in layers)
            _COMPUTE[key] = (fwd, bwd, float(ctx.workload.params))
    return _COMPUTE[key]


def peak_rate_hours(
    scenario: Scenario, gpu, precision: str, gpus: int, global_batch: int, steps: int
) -> float:
    """Hours ``steps`` steps of ``global_batch`` samples of the scenario's model take at least on
    ``gpus`` GPUs ``gpu`` (a catalog name or spec) at ``precision``, in any layout: the model's forward
    and backward FLOPs (the workload's kernels, which every layout splits but does not remove) spread
    evenly over every GPU at the GPU's highest dense peak (no kernel runs faster than its precision's
    peak in the roofline model; FP8's counted only for FP8 training), times COMPUTE_BOUND_MARGIN. 0.0
    where no bound is known: a calibration profile (its fitted GEMM rates), a custom list of layers,
    a GPU the catalog lacks. What lets `plan` leave a cluster out before its layout search."""
    from clustersim.catalog import gpu as catalog_gpu
    from clustersim.workloads import build_workload

    w = scenario.workload
    if scenario.profile is not None or w.model is None or gpus < 1:
        return 0.0
    try:
        spec = catalog_gpu(gpu) if isinstance(gpu, str) else gpu
    except InputError:
        return 0.0
    workload = build_workload(w)
    per_sample = (workload.forward_flops + workload.backward_flops) / w.micro_batch
    peak = max(v for k, v in spec.peak_tflops.items() if k != "fp8" or precision == "fp8") * 1e12
    return COMPUTE_BOUND_MARGIN * steps * global_batch * per_sample / (gpus * peak) / 3600
