"""Reading seconds per step from MLPerf result logs (clustersim.validation.mllog), on hand-made MLLOG
lines in the format of NVIDIA's GPT-3 submissions."""

import json

import pytest

from clustersim.validation.mllog import (
    block_step_times,
    computed_samples_per_s,
    epoch_throughputs,
    events,
    step_time,
    steps_per_epoch,
    throughput,
    train_step_timings,
)


def _line(key, value=None, time_ms=0, **metadata):
    e = {"namespace": "", "time_ms": time_ms, "event_type": "POINT_IN_TIME", "key": key, "value": value}
    return ":::MLLOG " + json.dumps({**e, "metadata": metadata})


HEADER = [_line("global_batch_size", 4), _line("max_sequence_length", 2), "a line that is not MLLOG"]


def test_train_step_timing_lines_give_the_median_step():
    run1 = [*HEADER] + [_line("tracked_stats", {"train_step_timing": t}) for t in (3.0, 1.0, 2.0)]
    run2 = [*HEADER, _line("tracked_stats", {"validation_step_timing": 9.0})]
    run2 += [_line("tracked_stats", {"train_step_timing": t}) for t in (4.0, 5.0)]
    assert train_step_timings(events("\n".join(run2))) == [4.0, 5.0]  # validation steps are not steps
    seconds, how = step_time(["\n".join(run1), "\n".join(run2)])
    assert seconds == 3.0 and "5 steps" in how  # median of 1, 2, 3, 4, 5


def _blocks(durations_ms, tokens=16):
    out, t = [*HEADER], 1000
    for d in durations_ms:
        out.append(_line("block_start", time_ms=t, epoch_count=tokens))
        out.append(_line("block_stop", time_ms=t + d, epoch_count=tokens))
        t += d + 500  # an evaluation between blocks is not counted
    return "\n".join(out)


def test_blocks_give_seconds_per_step_after_the_first():
    # 16 tokens a block at 4 sequences x 2 tokens a step: 2 steps a block
    evs = events(_blocks([9000, 4000, 6000]))
    assert block_step_times(evs) == [2.0, 3.0]  # the first block (warm-up) is left out
    seconds, how = step_time([_blocks([9000, 4000, 6000]), _blocks([1, 2000, 2000, 3000])])
    # run medians 2.5 and 1.0: their median
    assert seconds == pytest.approx(1.75) and "2 runs" in how


def test_logs_without_steps_are_refused():
    with pytest.raises(ValueError, match="neither"):
        step_time(["\n".join(HEADER)])


def test_epoch_throughputs_give_the_median_over_runs_of_each_runs_median_epoch():
    def run(rates):
        epochs = [_line("tracked_stats", {"throughput": r}, step=i) for i, r in enumerate(rates)]
        return "\n".join([*HEADER, *epochs])

    assert epoch_throughputs(events(run([10.0, 50.0, 40.0]))) == [50.0, 40.0]  # the first epoch is warm-up
    # run medians 45, 30 and 900 (a log off as a whole): their median
    rate, how = throughput([run([1.0, 50.0, 40.0]), run([1.0, 30.0]), run([1.0, 900.0, 800.0, 1000.0])])
    assert rate == 45.0 and "3 runs" in how


def test_logs_without_epoch_throughputs_are_refused():
    with pytest.raises(ValueError, match="no per-epoch"):
        throughput(["\n".join([*HEADER, _line("tracked_stats", {"throughput": 5.0})])])


def test_computed_rate_counts_the_filled_last_step_of_each_epoch():
    # MXNet ResNet-50 at 448 x 8 GPUs of 16: each shard 1,281,167 // 3,584 = 357 images, 23 steps of 16
    assert steps_per_epoch(1281167, 3584, 16) == 23
    assert steps_per_epoch(1281167, 8, 400) == 401
    header = [_line("global_batch_size", 8), _line("d_batch_size", 2), _line("train_samples", 9)]
    # 4 GPUs: shards of 2 images, 1 step of 8 images per epoch for 9 samples logged
    epochs = [_line("tracked_stats", {"throughput": r}) for r in (1.0, 90.0, 90.0)]
    rate, how = computed_samples_per_s(["\n".join(header + epochs)])
    assert rate == pytest.approx(90.0 * 8 / 9) and "1 steps" in how
    with pytest.raises(ValueError, match="train_samples"):
        computed_samples_per_s(["\n".join(header[:2] + epochs)])


def test_older_mxnet_logs_give_the_rate_as_the_throughput_keys_value():
    """NVIDIA's MXNet ResNet-50 code of v1.0-v2.1 logs each epoch as key "throughput" with the rate as
    its value (Dell's v2.1 XE8545 logs), later rounds as tracked_stats {"throughput": r}."""
    header = [_line("global_batch_size", 8), _line("d_batch_size", 2), _line("train_samples", 9)]
    old = "\n".join(
        header + [_line("throughput", r) for r in (1.0, 90.0, 90.0)] + [_line("throughput", True)]
    )
    assert epoch_throughputs(events(old)) == [90.0, 90.0]  # the first epoch is warm-up; a flag is no rate
    rate, _ = computed_samples_per_s([old])
    assert rate == pytest.approx(90.0 * 8 / 9)


def test_runs_at_different_batches_are_refused():
    def run(per_gpu):
        header = [_line("global_batch_size", 4 * per_gpu), _line("d_batch_size", per_gpu)]
        return "\n".join([*header, _line("train_samples", 9)] + [_line("throughput", r) for r in (1.0, 9.0)])

    with pytest.raises(
        ValueError, match=r"different global batches: 816 \(204 per GPU\), 1024 \(256 per GPU\)"
    ):
        computed_samples_per_s([run(256), run(256), run(204)])
    assert computed_samples_per_s([run(256), run(256)])[0] > 0
