"""Everything a strategy needs to build a program, resolved once per simulation."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from clustersim import catalog
from clustersim.calibration.profile import (
    ComputePhases,
    ModelCompute,
    Profile,
    has_hardware_rates,
    load_profile,
    thread_mismatch,
)
from clustersim.catalog import BYTES_PER_ELEMENT, GpuSpec, storage_precision
from clustersim.cost_models.collectives import CollectiveCost, CollectiveModel
from clustersim.cost_models.compute import DeviceCosts
from clustersim.cost_models.dispatch import Dispatch
from clustersim.cost_models.kernel_bytes import CLIP_BYTES, CLIP_KERNELS_PER_TENSOR, UPDATE_KERNELS_PER_TENSOR
from clustersim.cost_models.measured_collectives import MeasuredCollectives
from clustersim.cost_models.network_params import DEFAULT as DEFAULT_NETWORK
from clustersim.cost_models.network_params import NetworkParams
from clustersim.errors import InputError
from clustersim.scenario import Scenario, key_not_applying
from clustersim.simulator.measured_compute import (
    apply_model_compute,
    dispatch_precision,
    matching_model_compute,
    transfer_model_compute,
)
from clustersim.simulator.measured_compute import carry_sigma as measured_carry_sigma
from clustersim.simulator.program import MAX_PROGRAM_OPS
from clustersim.topologies.cluster import Cluster, GroupShape, build_cluster
from clustersim.workloads import Workload, build_workload
from clustersim.workloads.layers import Kernel, Layer


@dataclass
class SimulationContext:
    scenario: Scenario
    cluster: Cluster
    gpu: GpuSpec
    workload: Workload
    device: DeviceCosts
    collectives: CollectiveModel
    profile: Profile | None
    phases: ComputePhases | None
    dispatch: Dispatch | None = None
    #: the model's own measured compute (profile v4), when the profile has this model
    model_compute: ModelCompute | None = None
    notes: list[str] = field(default_factory=list)
    offload_placement: object = None  # offload.Placement once planned (one plan per simulation)
    offload_spec: object = None
    _host: object = None
    _layout: object = None
    network: object = None  # a NetworkBackend (simulator/network/), None for the analytical fast path
    _fwd_scale: float = 1.0
    _bwd_scale: float = 1.0
    _other_scale: float = 1.0  # the draw's compute factor on a measured "other" phase
    _host_scale: float = 1.0  # the draw's compute factor, on host dispatch as on the device
    _host_rate_scale: float = 1.0  # the draw's factor on host CPU/memory time (simulator/host.py)
    _fault_scale: float = 1.0  # the draw's factor on the host's page-fault cost (simulator/host.py)
    # one parameter draw of a band (build_context's perturbation): its result gives a time only, so what
    # explains the reported run (band sources, notes) is not worked out for it
    drawn: bool = False
    _host_fwd_scale: float = 1.0  # measured host phase / modelled (ModelCompute)
    _host_bwd_scale: float = 1.0
    _host_opt_scale: float = 1.0
    _update_scale: float = 1.0  # measured / modelled optimizer update (a measured model's rates)
    #: the measured model whose measured-to-modelled ratios this one's compute carries (another model
    #: of the profile's, on this device), when this model itself was not measured
    transferred_from: ModelCompute | None = None
    #: whether transferred_from is this model's own measurement at another sequence length
    carry_same_model: bool = False
    #: the measured model whose optimizer phase sets the update's rate (_update_scale), if any
    update_from: ModelCompute | None = None

    @cached_property
    def carry_sigma(self) -> float | None:
        """The log-sigma of carrying transferred_from's rates, measured on the profile's own models
        (measured_compute.carry_sigma; None: nothing to measure it on). Worked out when the band asks
        for it, once, not in every draw's context."""
        if self.transferred_from is None or self.profile is None:
            return None
        return measured_carry_sigma(self, self.profile, self.transferred_from, self.carry_same_model)

    @property
    def world(self) -> GroupShape:
        c = self.scenario.cluster
        return GroupShape(c.nodes, c.gpus_per_node)

    @property
    def layout(self):
        """Megatron's tensor x data x pipeline layout (simulator/model_parallel.py), built once."""
        if self._layout is None:
            from clustersim.simulator.model_parallel import Layout

            self._layout = Layout.of(self.scenario, self.workload)
        return self._layout

    @cached_property
    def model_parallel(self) -> bool:
        return self.scenario.training.parallelism.model_parallel

    @cached_property
    def tensor_sharded(self) -> bool:
        """ZeRO/FSDP or ZeRO-Offload over a tensor-parallel layout without a pipeline (TrainingSpec):
        ``workload`` is then ``layout.rank_workload`` (build_context)."""
        return self.scenario.training.tensor_sharded

    @cached_property
    def megatron_program(self) -> bool:
        """Whether Megatron-LM's own program runs the step (TrainingSpec.megatron_program)."""
        return self.scenario.training.megatron_program

    @cached_property
    def data_parallel(self) -> GroupShape:
        """The group gradients are reduced over: world / (tensor * pipeline) ranks at stride t
        (Megatron's order: tensor fastest, then data, then pipeline). The whole world without model
        parallelism."""
        return self.layout.data_group() if self.model_parallel else self.world

    @property
    def tensor_parallel(self) -> GroupShape:
        """The t ranks that split each layer (adjacent GPUs of one node when t <= GPUs per node)."""
        return self.layout.tensor_group()

    @property
    def pipeline_pair(self) -> GroupShape:
        """Two neighbouring pipeline stages, the pair a send/recv runs over."""
        return self.layout.pipeline_pair()

    @property
    def rank_params(self) -> float:
        """Parameters one rank holds: all of them with data parallelism, its stage's over t with
        model parallelism (the largest stage)."""
        return self.layout.rank_params if self.model_parallel else self.params

    @property
    def rank_activation_bytes(self) -> float:
        """Activations one rank keeps for backward at its peak."""
        return self.layout.activation_bytes if self.model_parallel else self.workload.activation_bytes

    @property
    def intra_node(self) -> GroupShape:
        return GroupShape(1, self.scenario.cluster.gpus_per_node)

    @property
    def world_size(self) -> int:
        return self.scenario.cluster.world_size

    @property
    def precision(self) -> str:
        return self.scenario.workload.precision

    @property
    def grad_bytes(self) -> int:
        """Bytes per communicated gradient element."""
        return BYTES_PER_ELEMENT[self.scenario.training.gradient_dtype or storage_precision(self.precision)]

    @property
    def element_bytes(self) -> int:
        """Bytes of a parameter or activation element as training keeps them: the precision's, bf16
        under FP8 training (only the linear layers' GEMM operands are FP8: workloads/fp8.py)."""
        return BYTES_PER_ELEMENT[storage_precision(self.precision)]

    @property
    def params(self) -> int:
        return self.workload.params

    def forward_time(self, layer: Layer) -> float:
        return self.device.kernels_time(layer.forward, self.precision) * self._fwd_scale

    def backward_time(self, layer: Layer) -> float:
        return self.device.kernels_time(layer.backward, self.precision) * self._bwd_scale

    def host_forward_time(self, layer: Layer) -> float:
        """Host dispatch time of ``layer``'s forward (its kernels, at the dispatch rate)."""
        return self.host_kernels_time(layer.forward)

    def host_backward_time(self, layer: Layer) -> float:
        kernels = self.device.kernels_launched(layer.backward)
        return self.dispatch.pass_time(kernels, False) * self._host_bwd_scale * self._host_scale

    def host_optimizer_time(self, param_tensors: int | None = None) -> float:
        """Host time of the optimizer step and zero_grad (over the rank's parameter tensors), scaled to a
        measured model's own where the profile has one (measured_compute)."""
        if self.phases is not None:  # measured phases: "other" holds the optimizer's host time
            return 0.0
        n = self.param_tensors if param_tensors is None else param_tensors
        return (
            self.dispatch.optimizer_time(n, self.update_kernels_per_tensor)
            * self._host_opt_scale
            * self._host_scale
        )

    @cached_property
    def host_syncs_before_update(self) -> bool:
        """Whether the host waits for backward's kernels before it dispatches the optimizer step
        (training.host_sync_before_update): by default where fp16's loss scaler reads its inf flag on
        the host every step (torch.amp.GradScaler.step, apex amp, DeepSpeed's fp16 optimizer)."""
        given = self.scenario.training.host_sync_before_update
        return self.precision == "fp16" if given is None else given

    @cached_property
    def host_syncs_after_forward(self) -> bool:
        """Whether the host waits for forward's kernels before it dispatches backward
        (training.host_sync_after_forward: the loss read on the host, a synchronised phase timer)."""
        return self.scenario.training.host_sync_after_forward

    @cached_property
    def param_tensors(self) -> int:
        return sum(len(layer.param_tensors) for layer in self.workload.layers)

    @cached_property
    def update_implementation(self) -> str:
        """How Adam's or SGD's update kernels run (training.optimizer_options.implementation): fused,
        foreach or for_loop; the compressed optimizers' updates are their own ("fused" here)."""
        return self.scenario.training.optimizer_options.get("implementation", "fused")

    @cached_property
    def update_kernels_per_tensor(self) -> int:
        """Kernels the update launches per parameter tensor from the host: torch.optim's for-loop path
        (kernel_bytes.UPDATE_KERNELS_PER_TENSOR; fused and foreach updates launch per tensor group) and
        gradient clipping called per tensor (kernel_bytes.CLIP_KERNELS_PER_TENSOR)."""
        clip = CLIP_KERNELS_PER_TENSOR[self.scenario.training.gradient_clipping]
        if self.update_implementation != "for_loop":
            return clip
        return UPDATE_KERNELS_PER_TENSOR[self.scenario.training.optimizer] + clip

    def update_device_time(
        self, bytes_per_param: float, params: float, param_tensors: float | None = None
    ) -> float:
        """The update's kernels over ``params`` parameters in ``param_tensors`` tensors: its bytes (and
        gradient clipping's, training.gradient_clipping) at the streaming rate, and for a for-loop update
        or per-tensor clipping each per-tensor kernel's fixed device cost."""
        n = self.param_tensors if param_tensors is None else param_tensors
        launches = self.device.launch_time(n * self.update_kernels_per_tensor)
        return self.gpu_update_time(bytes_per_param, params) + launches

    def gpu_update_time(self, bytes_per_param: float, params: float, kernel: str = "optimizer") -> float:
        """An update's passes over ``params`` parameters on the GPU at the rate of the profile's
        ``kernel``, with gradient clipping's (training.gradient_clipping) before them: every update
        path that runs on the GPU (DDP's, ZeRO's, Megatron's, an offload's GPU subgroups, a compressed
        optimizer's own kernel) prices its clipping here. Per-tensor launches are update_device_time's."""
        seconds = self.device.stream_time(bytes_per_param * params, kernel)
        if self.scenario.training.gradient_clipping != "none":
            seconds += self.device.stream_time(CLIP_BYTES * params, "optimizer")
        return seconds

    def clip_time(self, params: float) -> float:
        """Gradient clipping's passes over ``params`` fp32 gradients alone (a measured update phase
        that did not clip)."""
        return self.gpu_update_time(0.0, params)

    def rank_forward_time(self, layer: Layer) -> float:
        """One tensor-parallel rank's forward of ``layer`` (its kernels split by t)."""
        return self.rank_kernels_time(self.layout.kernels(layer.forward))

    def rank_kernels_time(self, kernels: tuple[Kernel, ...]) -> float:
        """Forward kernels already split to one tensor-parallel rank (Layout.recomputed_attention)."""
        return self.device.kernels_time(kernels, self.precision) * self._fwd_scale

    def host_kernels_time(self, kernels: tuple[Kernel, ...]) -> float:
        """Host dispatch time of forward ``kernels`` at the dispatch rate (a layer's, or the ones a
        recomputation re-runs)."""
        launched = self.device.kernels_launched(kernels)
        return self.dispatch.pass_time(launched, True) * self._host_fwd_scale * self._host_scale

    def rank_backward_time(self, layer: Layer) -> float:
        kernels = self.layout.kernels(layer.backward, backward=True)
        return self.device.kernels_time(kernels, self.precision) * self._bwd_scale

    def collective(
        self, op: str, nbytes: float, shape: GroupShape | None = None, algorithm: str | None = None
    ) -> CollectiveCost:
        algo = algorithm or self.scenario.training.collective_algorithm
        return self.collectives.cost(op, nbytes, shape or self.world, algo)

    @property
    def host(self):
        """The representative rank's share of host resources (simulator/host.py), built once."""
        if self._host is None:
            from clustersim.simulator.host import HostModel

            self._host = HostModel.of(self)
        return self._host

    def link_capacities(self) -> dict[str, float]:
        return self.host.links()

    def measured_other(self) -> float | None:
        """The profile's measured per-step work outside forward, backward and communication, times the
        draw's compute factor: a measurement of the same run as its forward and backward, as uncertain."""
        return self.phases.other_s * self._other_scale if self.phases else None


def _matching_phases(profile: Profile | None, scenario: Scenario, workload: Workload) -> ComputePhases | None:
    """Phases measured for this model configuration. The device was checked already
    (check_profile_device: the same chip, or refused), so a CPU profile's phases serve CPU hosts."""
    if profile is None:
        return None
    for p in profile.compute_phases:
        if (
            p.model == workload.name
            and p.micro_batch == workload.micro_batch
            and p.seq_len == workload.seq_len
            and p.precision == workload.precision
        ):
            return p
    return None


@dataclass(frozen=True)
class Perturbation:
    """One draw of the uncertain model parameters (simulator/uncertainty.py): the collective model's
    parameters and a factor on the device's time (forward, backward, host dispatch and every other
    kernel pass: update, casts, compression), a factor on the host's CPU and memory time
    (simulator/host.py: CPU Adam, streaming passes, pageable copies, memory reports) and one on its
    page faults (a property of the kernel and its settings, not of the CPU's rates: drawn apart)."""

    network: NetworkParams
    compute_scale: float = 1.0
    host_scale: float = 1.0
    fault_scale: float = 1.0


def network_params(profile: Profile | None, label: str = "profile") -> NetworkParams:
    """The collective model's parameters: the profile's fitted network model, else the defaults."""
    if profile is not None and profile.network is not None:
        return NetworkParams.from_calibration(profile.network, label)
    return DEFAULT_NETWORK


def _backward_ops_per_launch(scenario: Scenario) -> float | None:
    """Autograd ops per launch of the catalog model's backward, as its code's trace shows them; None
    for custom layers and for fused-kernel framework code (no trace of it: priced per launch)."""
    if scenario.workload.model is None:
        return None
    arch = catalog.model(scenario.workload.model)
    if arch.family == "transformer" and scenario.pointwise_code == "fused":
        return None
    return catalog.backward_ops_per_launch(arch)


def _check_layer_count(scenario: Scenario) -> None:
    """Custom layers are instantiated one per ``repeat`` and each is at least a forward and a backward
    op of every program, so more than half a program's op limit can never run: refused before
    1e8 layers are built (docs/scale-limits.md)."""
    layers = scenario.workload.layers or []
    total = sum(entry.repeat for entry in layers)
    if total > MAX_PROGRAM_OPS // 2:
        i = max(range(len(layers)), key=lambda k: layers[k].repeat)
        raise InputError(
            f"{total:,} layers in all: each is a forward and a backward op, over the "
            f"{MAX_PROGRAM_OPS:,} ops a program may hold (docs/scale-limits.md)",
            key=f"workload.layers.{i}.repeat",
        )


def device_costs(scenario: Scenario, gpu, profile: Profile | None = None) -> DeviceCosts:
    """The device's costs for this scenario's code on ``gpu``: its execution mode, pointwise code,
    implementation and fused-attention library, with ``profile``'s measurements where given."""
    return DeviceCosts(
        gpu,
        profile,
        scenario.workload.execution,
        scenario.pointwise_code == "unfused",
        scenario.implementation,
        scenario.attention_kernel,
        scenario.attention_dropout > 0,
    )


def build_context(
    scenario: Scenario, profile: Profile | str | None = None, perturbation: Perturbation | None = None
) -> SimulationContext:
    ref = profile if profile is not None else scenario.profile
    try:
        prof = load_profile(ref) if isinstance(ref, str) else ref
    except InputError as exc:
        if profile is not None:
            raise
        # the scenario's own profile key: name the scenario and the key, then the profile's problem
        inner = ": ".join(p for p in (exc.source or ref, exc.key, exc.message) if p)
        raise InputError(inner, source=scenario.source, key="profile") from None
    gpu = catalog.gpu(scenario.cluster.gpu)
    device_note = check_profile_device(prof, gpu, _profile_label(ref, prof)) if prof is not None else None
    cluster = build_cluster(scenario.cluster)
    _check_layer_count(scenario)
    unfused = scenario.pointwise_code == "unfused"
    tensor = scenario.training.parallelism.tensor
    workload = build_workload(scenario.workload, unfused, scenario.vocab_multiple, tensor)
    execution = scenario.workload.execution
    device = device_costs(scenario, gpu, prof)
    c = scenario.cluster
    measured_on = prof.network.cluster if prof is not None and prof.network is not None else None
    measured = MeasuredCollectives.for_cluster(prof.collectives, c, measured_on) if prof else None
    params = perturbation.network if perturbation else network_params(prof, _profile_label(ref, prof))
    ctx = SimulationContext(
        scenario,
        cluster,
        gpu,
        workload,
        device,
        CollectiveModel(cluster, measured, params),
        prof,
        _matching_phases(prof, scenario, workload),
        Dispatch.of(gpu, execution, prof, scenario.implementation, _backward_ops_per_launch(scenario)),
        matching_model_compute(prof, workload, scenario.implementation, execution),
    )
    if ctx.model_compute is not None:
        apply_model_compute(ctx, ctx.model_compute)
    elif prof is not None and prof.model_compute and ctx.phases is None:
        transfer_model_compute(ctx, prof)
    if ctx.model_compute is None and ctx.phases is not None:
        fwd = sum(device.kernels_time(layer.forward, ctx.precision) for layer in workload.layers)
        bwd = sum(device.kernels_time(layer.backward, ctx.precision) for layer in workload.layers)
        ctx._fwd_scale = ctx.phases.forward_s / fwd
        ctx._bwd_scale = ctx.phases.backward_s / bwd
        # measured wall times of the phases already hold the host's dispatch
        ctx._host_fwd_scale = ctx._host_bwd_scale = 0.0
        ctx.notes.append(
            f"forward/backward from measured phases ({ctx.phases.source or 'profile'}), "
            "spread over layers in proportion to the roofline"
        )
        if ctx.phases.compute_only:
            device.stream_scale = 0.0
            ctx.notes.append(
                "compute_only phases: the step is forward + backward; the update, casts, copies, compression "
                "and outer kernels take no time (the idealised simulation the profile reproduces)"
            )
    if device_note:
        ctx.notes.append(device_note)
    ctx.notes.extend(_thread_notes(ctx, _profile_label(ref, prof)))
    ctx.notes.extend(_ignored_workload_keys(scenario))
    ctx.notes.extend(_unused_attention_keys(ctx))
    ctx.notes.extend(_ignored_training_keys(scenario))
    unmeasured = _unmeasured_code_note(scenario, prof)
    if unmeasured:
        ctx.notes.append(unmeasured)
    measured_at = dispatch_precision(ctx) if ctx.model_compute is None and ctx.phases is None else None
    if measured_at is not None:
        ctx.notes.append(
            f"the profile's host dispatch rates were measured at {measured_at}, the scenario runs "
            f"{ctx.precision}: used as they are, and the compute band is as wide as the defaults' (a "
            "precision's kernels, casts and host work are its own)"
        )
    other = _other_cluster_note(measured, c, _profile_label(ref, prof))
    if other:
        ctx.notes.append(other)
    if ctx.tensor_sharded:
        _run_one_tensor_rank(ctx)
    if scenario.training.network == "flow":
        from clustersim.simulator.network.flow import FlowBackend

        ctx.network = FlowBackend(ctx)
    if perturbation is not None:
        ctx.drawn = True
        if ctx.phases is None or not ctx.phases.stated:  # a stated step time is exact: no draw moves it
            ctx._fwd_scale *= perturbation.compute_scale
            ctx._bwd_scale *= perturbation.compute_scale
            ctx._other_scale = perturbation.compute_scale
        ctx._host_scale = perturbation.compute_scale
        ctx._host_rate_scale = perturbation.host_scale
        ctx._fault_scale = perturbation.fault_scale
        ctx._host = None  # rebuilt with the draw's host factor
        # set last: the measured-to-modelled ratios above (apply_model_compute) are taken unscaled
        # (a compute_only step prices those passes at zero in every draw)
        compute_only = ctx.phases is not None and ctx.phases.compute_only
        device.stream_scale = 0.0 if compute_only else perturbation.compute_scale
    return ctx


def _unused_attention_keys(ctx: SimulationContext) -> list[str]:
    """A note when workload.attention_kernel or attention_dropout, set on a transformer, prices nothing:
    attention that is not fused, a chip with no published rates of fused kernels, or measured phases
    or a measured model that price the step's compute (a setting that changes nothing says so)."""
    spec = ctx.scenario.workload
    said = sorted({"attention_kernel", "attention_dropout"} & spec.model_fields_set)
    if not said or spec.model is None or catalog.model(spec.model).family == "resnet":
        return []
    keys = " and ".join(f"workload.{k}" for k in said)
    if spec.attention != "fused":
        why = f"workload.attention is {spec.attention}: no fused kernel runs"
    elif ctx.device.attention_kernel is None:
        chip = ctx.gpu.chip
        why = f"no published rates of fused attention kernels exist for the {chip}: it runs at the GEMM rate"
    elif ctx.model_compute is not None or ctx.phases is not None:
        why = "the profile's measured step prices the model's compute"
    else:
        return []
    return [f"{keys}: not used ({why})"]


def _ignored_workload_keys(scenario) -> list[str]:
    """One note per workload key the scenario sets that its model does not use (a transformer's
    attention on ResNet-50, a convolution layout on a transformer), so that a setting that changes
    nothing says so instead of passing silently."""
    spec = scenario.workload
    if spec.model is None:
        return []
    convolutional = catalog.model(spec.model).family == "resnet"
    notes = [
        f"{said}: it is not used"
        for k in sorted(spec.model_fields_set)
        if (said := key_not_applying(k, [spec.model])) is not None
    ]
    if not convolutional and spec.attention == "eager" and spec.execution == "compiled":
        notes.append(
            "workload.attention eager under execution compiled: torch.compile fuses the scale, mask, "
            "softmax and dropout over the scores into kernels of its own, which attention unfused describes"
        )
    if convolutional and spec.batch_norm != "separate":
        # NormConvolution and ScaleBiasAddRelu are 16-bit NHWC kernels (the MLPerf symbol files)
        unlike = [
            f"{key} {value}"
            for key, value, fused_kernels_take in (
                ("memory_format", spec.memory_format, {"channels_last"}),
                ("precision", spec.precision, {"fp16", "bf16"}),
            )
            if value not in fused_kernels_take
        ]
        if unlike:
            notes.append(
                f"workload.batch_norm {spec.batch_norm} with {' and '.join(unlike)}: the fused kernels it "
                "describes (NVIDIA's MLPerf ResNet code) run on 16-bit channels_last tensors; priced as given"
            )
    return notes


def _ignored_training_keys(scenario) -> list[str]:
    """One note per training key the scenario sets that its layout never reads (sequence parallelism
    without a tensor-parallel group, a pipeline schedule without a pipeline, offload settings with
    offload off, ZeRO stage-3 prefetch settings below stage 3), as _ignored_workload_keys does for the
    workload: a setting that changes nothing says so."""
    t = scenario.training
    par, off, sh = t.parallelism, t.offload, t.sharding
    unused = []
    if par.tensor == 1 and par.sequence_parallel and "sequence_parallel" in par.model_fields_set:
        unused.append(("parallelism.sequence_parallel", "it splits a tensor-parallel group's activations"))
    if par.pipeline == 1:
        unused += [
            (f"parallelism.{k}", "pipeline 1 has no pipeline to schedule")
            for k in ("schedule", "virtual_stages")
            if k in par.model_fields_set and getattr(par, k) != type(par).model_fields[k].default
        ]
    if off.mode == "none":
        unused += [(f"offload.{k}", "offload.mode is none") for k in sorted(off.model_fields_set - {"mode"})]
    if sh.framework == "deepspeed" and sh.stage < 3:
        unused += [
            (f"sharding.{k}", f"a ZeRO stage-3 setting, at stage {sh.stage}")
            for k in ("prefetch_bucket_mb", "max_live_parameters")
            if k in sh.model_fields_set
        ]
    return [f"training.{key} is not used: {why}" for key, why in unused]


def _other_cluster_note(measured: MeasuredCollectives | None, c, label: str) -> str | None:
    """One line naming a profile measured on other hardware than the scenario's, in the parts the
    scenario's collectives use: its exact-shape fits then give way to its fitted parameters."""
    if measured is None:
        return None
    differs = measured.relevant_differences(GroupShape(c.nodes, c.gpus_per_node))
    if not differs:
        return None
    return (
        f"profile {label} was measured on another cluster ({'; '.join(differs)}): its exact-shape "
        "collective fits are not used, its fitted network parameters price this cluster's links"
    )


def _run_one_tensor_rank(ctx: SimulationContext) -> None:
    """Under ZeRO/FSDP or offload with tensor parallelism the data-parallel programs see one tensor-
    parallel rank's model (``tensor_sharded``); the layout keeps the whole model it split."""
    lay = ctx.layout  # built from the whole model before the swap
    ctx.workload = lay.rank_workload
    if lay.tensor > lay.gpus_per_node:
        ctx.notes.append(
            f"tensor-parallel group of {lay.tensor} spans nodes: its per-layer collectives cross the network"
        )


def check_profile_device(profile: Profile, gpu: GpuSpec, label: str) -> str | None:
    """A profile describes the hardware it was measured on. Another form factor of the same chip
    (V100-PCIe for V100-SXM2) is allowed with a note; another chip is refused: CPU/gloo fits applied
    to H100s, or an A100's GEMM rates to an H100, would silently change every number."""
    if profile.device == gpu.name:
        return None
    if catalog.chip_of(profile.device) == gpu.chip:
        kept = [
            part
            for part, present in (
                ("compute rates keep their efficiency", has_hardware_rates(profile)),
                ("interconnect fits their link classes", bool(profile.collectives or profile.network)),
            )
            if present
        ]
        return (
            f"profile {label} was measured on {profile.device}, used for {gpu.name} (same {gpu.chip} chip)"
            + (f": {', '.join(kept)}" if kept else "")
        )
    raise InputError(
        f"profile measured on {profile.device!r} does not apply to {gpu.name} (another chip); "
        "calibrate on this hardware, or run without --profile",
        source=label,
        key="device",
    )


def _thread_notes(ctx: "SimulationContext", label: str) -> list[str]:
    """A CPU profile's model measurement used at hardware rates measured on another thread count (the
    model's own entry scaled by them, or another model's carried at them): one note naming both."""
    used = ctx.model_compute or ctx.transferred_from
    why = thread_mismatch(ctx.profile, used) if ctx.profile is not None and used is not None else None
    return [f"profile {label}: {why}"] if why else []


def _profile_label(ref, prof: Profile | None) -> str:
    if isinstance(ref, str):
        return ref
    return prof.label if prof is not None else "profile"


def _unmeasured_code_note(scenario: Scenario, prof) -> str | None:
    """A ``workload.implementation`` that is neither a known code nor the code of any of the profile's
    measurements names code nothing here has seen (a misspelt name, or a profile not given): say so,
    instead of taking the name without a word."""
    code = scenario.workload.implementation
    known = catalog.known_implementations()
    if code is None or code.lower() in known:
        return None
    measured = prof.model_compute if prof is not None and prof.model_compute else []
    if any((m.fingerprint.implementation or "").lower() == code.lower() for m in measured):
        return None
    return (
        f"workload.implementation {code!r} is none of {', '.join(known)} and no measurement in the "
        "profile is of that code: nothing measured prices it, the step is priced from the catalog's rates"
    )
