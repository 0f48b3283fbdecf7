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
    return COMPUTE_BOUND_MARGIN * (compute + _megatron_gradient_sync(scenario, params))


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
    after the last backward (not overlapped): a ring's (d-1)/d of the rank's parameters' bytes each way
    (reduce-scatter and all-gather of the distributed optimizer, or the two halves of an all-reduce)
    through the NICs of its node, shared with its stage's other tensor-parallel ranks. Counted only
    where every data-parallel peer is on another node (t x p a multiple of the GPUs per node); 0 for
    other layouts, whose exchange may hide behind compute."""
    from clustersim.catalog import BYTES_PER_ELEMENT
    from clustersim.topologies.node import nic_bandwidth

    c, par = scenario.cluster, scenario.training.parallelism
    if not scenario.training.megatron_program or c.nic.count < 1:
        return 0.0
    ranks = par.tensor * par.pipeline
    d = c.world_size // ranks
    if d < 2 or ranks % c.gpus_per_node:
        return 0.0
    grad = BYTES_PER_ELEMENT[scenario.training.gradient_dtype or scenario.workload.precision]
    weights = BYTES_PER_ELEMENT[scenario.workload.precision] if par.distributed_optimizer else grad
    per_rank = params / ranks * (grad + weights) * (d - 1) / d
    # the critical (first) stage syncs last, when the node's other stages are done: only its t
    # tensor-parallel ranks share the node's NICs then
    return per_rank / (c.nic.count * nic_bandwidth(c) / par.tensor)


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
