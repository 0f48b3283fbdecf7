"""Reading seconds per step from MLPerf result logs (clustersim.validation.mllog), on hand-made MLLOG
lines in the format of NVIDIA's GPT-3 submissions."""

import json

import pytest

from clustersim.validation.mllog import (
    block_step_times,
    epoch_throughputs,
    events,
    step_time,
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
