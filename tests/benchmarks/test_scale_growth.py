"""The growth-curve harness's pure parts: the synthetic token bags, the encoded-query stand-ins and
the size loop's stopping rules (the measurements themselves are too long for CI)."""

import numpy as np

from benchmarks.scale import grow
from benchmarks.scale_growth import render, weighted_queries, zipf_bags


def test_zipf_bags_are_deterministic_and_shaped_as_asked():
    offsets, ranks = zipf_bags(2000, 150, 30_000, np.random.default_rng(7))
    again = zipf_bags(2000, 150, 30_000, np.random.default_rng(7))
    assert np.array_equal(offsets, again[0]) and np.array_equal(ranks, again[1])
    assert len(offsets) == 2001 and offsets[0] == 0 and offsets[-1] == len(ranks)
    assert np.all(np.diff(offsets) >= 1) and abs(np.diff(offsets).mean() - 150) < 2
    assert ranks.min() >= 0 and ranks.max() < 30_000
    counts = np.bincount(ranks, minlength=30_000)
    assert counts.argmax() == 0 and counts[0] > 1.8 * counts[1] > counts[10]  # Zipf: p(rank r) ~ 1 / (r + 1)


def test_render_joins_each_bag_s_words():
    words = np.array(["a", "b", "c"], dtype=object)
    assert render(np.array([0, 2, 3]), np.array([2, 0, 1]), words) == ["c a", "b"]


def test_weighted_queries_have_distinct_columns_of_the_vocabulary():
    columns = np.random.default_rng(0).permutation(500)
    queries = weighted_queries(4, 50, columns, np.random.default_rng(1))
    assert queries.shape == (4, 500) and np.all(np.diff(queries.indptr) == 50)
    assert all(len(set(queries[i].indices)) == 50 for i in range(4)) and queries.data.min() > 0


def test_grow_stops_a_measure_over_the_cap_or_at_its_largest_size():
    seconds = {"slow": lambda n: n / 10, "fast": lambda n: 0.0, "small": lambda n: 0.0}
    saved = []
    grow([100, 10, 1000], lambda n: {name: (lambda f=f, n=n: {"seconds": f(n)}) for name, f in seconds.items()},
         cap=5, largest={"small": 10}, save=lambda measures, stopped: saved.append((measures, dict(stopped))))
    measures, stopped = saved[-1]
    assert [m["documents"] for m in measures["slow"]] == [10, 100]  # 10 s at 100 > cap: not run at 1000
    assert [m["documents"] for m in measures["fast"]] == [10, 100, 1000]
    assert [m["documents"] for m in measures["small"]] == [10]
    assert stopped == {"slow": 100} and len(saved) == 6  # saved after every measure
