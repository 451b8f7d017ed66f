"""The loop-to-endpoint benchmark's arithmetic (benchmarks/serving.py): percentiles, the cut of a
batch's path into segments, their medians over batches, the load phases' statistics and the
targets table, each against a hand computation. Nothing here starts a process or times anything."""

import time

import pytest

from benchmarks.serving import Mark, breakdown, percentile, request_stats, segments, summary, targets


def test_percentile_interpolates_between_the_closest_ranks_as_numpy_does():
    values = [7.0, 1.0, 3.0, 5.0]  # sorted: 1, 3, 5, 7
    assert percentile(values, 50) == pytest.approx(4.0)  # rank 1.5: halfway between 3 and 5
    assert percentile(values, 95) == pytest.approx(6.7)  # rank 2.85: 5 + 0.85 * 2
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 7.0
    assert percentile([2.5], 99) == 2.5
    assert percentile([], 50) is None
    numpy = pytest.importorskip("numpy")
    sample = [0.3, 9.1, 4.4, 4.4, 12.0, 0.0, 7.7]
    for q in (1, 25, 50, 90, 95, 99):
        assert percentile(sample, q) == pytest.approx(float(numpy.percentile(sample, q)))


def test_summary_of_ten_latencies():
    stats = summary([float(v) for v in range(1, 11)])  # 1..10
    # p50: rank 4.5 -> 5.5; p95: rank 8.55 -> 9.55; p99: rank 8.91 -> 9.91
    assert stats == {"n": 10, "p50": 5.5, "p95": 9.55, "p99": 9.91, "mean": 5.5, "max": 10.0}
    assert summary([]) == {"n": 0, "p50": None, "p95": None, "p99": None, "mean": None, "max": None}


def test_segments_cut_the_path_at_every_mark_and_sum_to_the_total():
    start = 100.0
    marks = [Mark(103.0, "job dequeued", "run queue"), Mark(101.0, "job requested", "sensor tick"),
             Mark(99.0, "before the submit", "sensor wait"),  # left out: before the start
             Mark(108.0, "job ended", "step overhead"),  # left out: after the endpoint answered
             Mark(105.5, "job: step", "step"), Mark(106.0, "job: step", "step")]
    path = segments(start, marks, Mark(107.0, "the endpoint answers", "endpoint"))
    assert [(s["label"], s["seconds"], s["at_s"]) for s in path] == [
        ("job requested", 1.0, 1.0), ("job dequeued", 2.0, 3.0), ("job: step", 2.5, 5.5),
        ("job: step #2", 0.5, 6.0), ("the endpoint answers", 1.0, 7.0)]
    assert sum(s["seconds"] for s in path) == pytest.approx(7.0)
    assert path[1]["category"] == "run queue"


def test_breakdown_takes_medians_per_segment_and_per_category_over_batches():
    def batch(queue, step, endpoint):
        return [{"label": "dequeued", "category": "run queue", "seconds": queue},
                {"label": "a step", "category": "step", "seconds": step},
                {"label": "another step", "category": "step", "seconds": 1.0},
                {"label": "answers", "category": "endpoint", "seconds": endpoint}]

    result = breakdown([batch(1.0, 2.0, 0.5), batch(3.0, 4.0, 0.7), batch(2.0, 9.0, 0.6)])
    by_label = {s["label"]: s for s in result["segments"]}
    assert by_label["dequeued"] == {"label": "dequeued", "category": "run queue", "median_s": 2.0, "max_s": 3.0,
                                    "batches": 3}
    assert by_label["a step"]["median_s"] == 4.0
    # per batch the two steps add up (3, 5, 10), and the median is taken of those sums
    assert result["categories"]["step"] == {"median_s": 5.0, "batches": 3}
    assert list(result["categories"]) == ["run queue", "step", "endpoint"]  # the path's order


def test_request_stats_count_errors_apart_and_rate_only_the_answered_requests():
    requests = [{"at": 0, "seconds": s, "error": None, "version": "3"} for s in (0.010, 0.020, 0.030, 0.040)]
    requests += [{"at": 0, "seconds": 5.0, "error": "TimeoutError: timed out", "version": None},
                 {"at": 0, "seconds": 0.001, "error": "RuntimeError: HTTP 503: b''", "version": None}]
    stats = request_stats(requests, batch_size=32, seconds=2.0)
    assert (stats["requests"], stats["ok"], stats["errors"]) == (6, 4, 2)
    assert stats["error_kinds"] == {"TimeoutError": 1, "RuntimeError": 1}
    assert stats["latency_ms"]["p50"] == 25.0 and stats["latency_ms"]["max"] == 40.0  # failed ones left out
    assert stats["requests_per_s"] == 2.0 and stats["queries_per_s"] == 64.0
    assert stats["versions"] == {"3": 4}


def test_targets_compare_what_was_measured_and_leave_the_rest_unmeasured():
    def load(p99_ms, errors):
        return {"latency_ms": {"p99": p99_ms}, "errors": errors}

    result = {"loop": {"searchable_s": {"p50": 8.0, "p95": 31.0}},
              "load": {"conditions": {"idle": {"1": load(40.0, 0), "32": load(900.0, 0)},
                                      "in_process": {"1": load(5.0, 7)},  # not the server's: not counted
                                      "swap": {"1": {**load(120.0, 2),  # the whole phase; the swap's own window:
                                                     "swap": {"window": {"latency_ms": {"p99": 300.0}, "requests": 40}}}}},
                       "throughput_ratio": {"1": 1.5, "32": 2.5}, "memory": {"swap_ratio": 1.2},
                       "updates_served": 4, "swaps_served": 2}}
    rows = {row["target"]: row for row in targets(result)}
    assert rows["submit -> searchable p50"]["met"] is True
    assert rows["submit -> searchable p95"]["met"] is False
    assert rows["single-query p99, idle"]["measured"] == 40.0 and rows["single-query p99, idle"]["met"]
    assert rows["single-query p99, during a swap"]["measured"] == 300.0  # the window around the swap, not the phase
    assert rows["single-query p99, during a swap"]["met"] is False
    assert rows["in-process / server throughput, batch 1"]["met"] is True
    assert rows["in-process / server throughput, batch 32"]["met"] is False
    assert rows["failed requests"]["measured"] == 2 and rows["failed requests"]["met"] is False
    unmeasured = {row["target"]: row for row in targets({})}
    assert unmeasured["submit -> searchable p50"]["met"] is None and "failed requests" not in unmeasured


def test_a_version_served_from_a_commit_is_registered_when_its_lineage_registers_its_retriever_version(tmp_path):
    """``N+vNNNN`` (answered from a commit row): the creation time of the version that registered
    retriever version vNNNN in N's lineage, not of a same-named one in another lineage."""
    from mlflow import MlflowClient

    from benchmarks.serving import Workspace, version_created

    ws = Workspace(tmp_path, tmp_path / "params.yaml", "m", {})
    client = MlflowClient(tracking_uri=ws.uri, registry_uri=ws.uri)
    client.create_registered_model("m")
    made = {}
    for tags in ({}, {"lineage_root": "1", "retriever_version": "v0001"}, {},  # 3: a second lineage's full training
                 {"lineage_root": "3", "retriever_version": "v0001"}):
        version = client.create_model_version("m", "file:///nowhere", tags=tags)
        made[str(version.version)] = version.creation_timestamp / 1000
        time.sleep(0.005)  # each its own millisecond: a wrong version gives another time
    assert len(set(made.values())) == 4
    assert version_created(ws, "1+v0001") == made["2"] and version_created(ws, "3+v0001") == made["4"]
    assert version_created(ws, "2") == made["2"] and version_created(ws, "1+v0002") is None  # not registered
