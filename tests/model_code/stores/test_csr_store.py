"""The sparse store (``model_code/stores/csr_store.py``) against NumPy: searches by brute force (ties by
row, removed rows never ranked, queries in chunks), additions, removals, saves, and the errors that
name the ids at fault."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from model_code.stores.csr_store import CsrStore


def test_sparse_index_search_add_and_remove_against_numpy(tmp_path):
    rng = np.random.default_rng(0)
    dense = rng.random((6, 9)) * (rng.random((6, 9)) < 0.5)
    index = CsrStore.build(sp.csr_matrix(dense.astype(np.float32)), [f"d{i}" for i in range(6)])
    queries = rng.random((3, 9)).astype(np.float32)
    scores, rows = index.search_rows(sp.csr_matrix(queries), 4)
    expected = queries @ dense.T
    np.testing.assert_array_equal(rows, np.argsort(-expected, axis=1, kind="stable")[:, :4])
    np.testing.assert_allclose(scores, np.sort(expected, axis=1)[:, ::-1][:, :4], rtol=1e-5)

    extra = rng.random((2, 9))
    index.add(sp.csr_matrix(extra.astype(np.float32)), ["d6", "d1b"])
    assert index.remove(["d1", "d4"]) == 2
    index.add(sp.csr_matrix(extra[:1].astype(np.float32)), ["d1"])  # a removed id comes back as a new row
    with pytest.raises(ValueError, match="already indexed"):
        index.add(sp.csr_matrix(extra[:1].astype(np.float32)), ["d6"])
    with pytest.raises(KeyError, match="d4"):
        index.remove(["d4"])
    index.save(tmp_path / "index")
    loaded = CsrStore.load_files(tmp_path / "index")
    assert loaded.live_ids() == ["d0", "d2", "d3", "d5", "d6", "d1b", "d1"]
    all_rows = np.vstack([dense, extra, extra[:1]])
    live = [0, 2, 3, 5, 6, 7, 8]
    scores, rows = loaded.search_rows(sp.csr_matrix(queries), 10)  # cut to the 7 live rows
    row_ids = ["d0", "d1", "d2", "d3", "d4", "d5", "d6", "d1b", "d1"]
    for q, s, r, ids in zip(queries, scores, rows, loaded.search(sp.csr_matrix(queries), 10)[1]):
        by_hand = {row: float(q @ all_rows[row]) for row in live}
        assert r.tolist() == sorted(by_hand, key=lambda row: (-by_hand[row], row))
        assert ids == [row_ids[row] for row in r]  # the store's search: the same hits, by id
        np.testing.assert_allclose(s, [by_hand[row] for row in r], rtol=1e-5)
    assert loaded.remove(["d1"]) == 1 and loaded.live.tolist() == [True, False, True, True, False, True, True, True, False]


def test_equal_scores_rank_by_row_and_removed_rows_never_rank():
    """A binary index scores a query of ones by each row's token count: hundreds of ties, which
    the index orders by row (its documented tie rule), brute force over the live rows."""
    rng = np.random.default_rng(3)
    bags = (rng.random((300, 6)) < 0.4).astype(np.float32)
    index = CsrStore.build(sp.csr_matrix(bags), [f"d{i}" for i in range(300)])
    index.remove([f"d{i}" for i in range(0, 300, 7)])
    queries = np.array([[1.0] * 6, [1.0, 1.0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 2.0]], dtype=np.float32)
    scores, rows = index.search_rows(sp.csr_matrix(queries), 120)
    live = [r for r in range(300) if r % 7]
    for q, s, r in zip(queries, scores, rows):
        by_hand = {row: float(q @ bags[row]) for row in live}
        assert len(set(by_hand.values())) < 8  # ties everywhere
        assert r.tolist() == sorted(live, key=lambda row: (-by_hand[row], row))[:120]
        assert s.tolist() == [by_hand[row] for row in r]


def test_a_search_over_more_queries_than_one_chunk_is_the_same():
    rng = np.random.default_rng(4)
    matrix = sp.csr_matrix(rng.random((20, 4)).astype(np.float32))
    queries = rng.random((11, 4)).astype(np.float32)  # more queries than dimensions
    index = CsrStore.build(matrix, [f"d{i}" for i in range(20)])
    scores, rows = index.search_rows(sp.csr_matrix(queries), 5, chunk=3)  # chunks of 3, 3, 3 and 2 queries
    dense = queries @ matrix.toarray().T
    assert rows.tolist() == [sorted(range(20), key=lambda j: (-d[j], j))[:5] for d in dense]
    np.testing.assert_allclose(scores, np.take_along_axis(dense, rows, axis=1), rtol=1e-6)


def test_an_index_saves_into_a_new_nested_folder_and_over_an_earlier_save(tmp_path):
    index = CsrStore.build(sp.csr_matrix(np.eye(3, dtype=np.float32)), ["a", "b", "c"])
    index.save(tmp_path / "new" / "nested")  # parents created
    index.remove(["b"])
    index.save(tmp_path / "new" / "nested")  # the folder exists: overwritten
    loaded = CsrStore.load_files(tmp_path / "new" / "nested")
    assert loaded.live_ids() == ["a", "c"] and loaded.live.dtype == bool and (loaded.matrix != index.matrix).nnz == 0


def test_a_clash_or_a_missing_id_is_named_changes_nothing_and_lists_at_most_five_ids():
    ids = [f"d{i}" for i in range(8)]
    index = CsrStore.build(sp.csr_matrix(np.eye(8, dtype=np.float32)), ids)
    with pytest.raises(ValueError, match=r"^documents already indexed: \['d1', 'd2', 'd3', 'd4', 'd5'\]$"):
        index.add(sp.csr_matrix(np.eye(8, dtype=np.float32)[:7]), ["new", *reversed(ids[1:7])])
    with pytest.raises(KeyError, match=r"documents not in the index: \['x1', 'x2', 'x3', 'x4', 'x5'\]"):
        index.remove(["d0", *[f"x{i}" for i in range(7, 0, -1)]])
    assert index.live_ids() == ids and index.matrix.shape == (8, 8)  # neither call changed the index
    assert index.remove(["d0"]) == 1 and index.live_ids() == ids[1:]
