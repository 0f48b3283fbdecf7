"""What a profile measured of the network, in words and flags (`calibrate show` and its --json).

A profile of one GPU (the shipped ``builtin:h200-pytorch-2.11``) has no collective across two ranks: its
device rates are measured, but every collective it prices comes from the topology model with the
default constants, as with no profile. Nothing in the profile's own fields says so in so many words (an
absent ``network``, an empty ``collectives``), so a user reading `calibrate show` could take the network
for calibrated; this says which part of the network the profile's measurements cover and which part the
defaults price.
"""

from __future__ import annotations

# What `run` calls a collective priced without calibration (cost_models.network_params' default source),
# and where its constants live.
DEFAULTS = "the topology model with the default constants (clustersim/catalogs/hardware_defaults.yaml)"


def _shapes(shapes) -> str:
    return ", ".join(f"{n}x{g}" for n, g in sorted(set(shapes)))


def network_coverage(profile) -> dict:
    """``collectives_measured``: a collective across two or more ranks was measured; ``network_measured``:
    one across two or more nodes was; ``model_fitted``: the collective model's parameters were fitted
    (``network``), so shapes not measured are priced from them; ``summary``: one sentence saying so and
    what the defaults price."""
    fits = [(f.nodes, f.gpus_per_node) for f in profile.collectives if f.nodes * f.gpus_per_node > 1]
    net = profile.network
    shapes = list(net.shapes) if net is not None else []
    groups = fits + shapes
    across = any(n > 1 for n, _ in groups)
    if not groups:
        why = " (one device)" if profile.provenance.device_count == 1 else ""
        if profile.launch_latency_s is not None:  # one rank's "collective": kept, priced by nothing
            why = (
                f" (one device: only its collective launch latency was timed, "
                f"{profile.launch_latency_s * 1e6:,.1f} µs, which no prediction uses)"
            )
        summary = (
            f"no collective or network was measured{why}; every collective is priced by {DEFAULTS}, "
            "as without a profile"
        )
    elif net is None:
        summary = (
            f"collective model not fitted: only the measured shapes ({_shapes(fits)}) use their own fits, on "
            f"the hardware they ran on; every other collective is priced by {DEFAULTS}"
        )
        if not across:
            summary += "; no network between nodes was measured"
    else:
        classes = ", ".join(net.calibrated_classes) or "none"
        summary = f"collective model fitted on groups {_shapes(shapes)} (links calibrated: {classes})"
        if not across:
            summary += f"; no network between nodes was measured: its links are priced by {DEFAULTS}"
        else:
            summary += f"; links of other classes are priced by {DEFAULTS}"
    return {
        "collectives_measured": bool(groups),
        "network_measured": across,
        "model_fitted": net is not None,
        "summary": summary,
    }
