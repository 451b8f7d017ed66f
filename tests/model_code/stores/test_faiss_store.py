"""The dense store (``model_code/stores/faiss_store.py``) against brute force: each index factory
finds each document itself, additions and removals equal a rebuild, a delta replays onto its base
(what an incremental version stores), and an invalid factory is a clear error."""

import json

import numpy as np
import pytest

from model_code.config import IndexParams
from model_code.stores.faiss_store import FaissStore
from tests.helpers.vectors import unit_rows


def test_an_index_delta_replays_adds_and_removes_onto_its_base(tmp_path):
    base_vectors, new_vectors = unit_rows(5, 8, 0), unit_rows(3, 8, 1)
    FaissStore.build(base_vectors, [f"b{i}" for i in range(5)]).save(tmp_path / "base")
    writer = FaissStore.load_files(tmp_path / "base")
    writer.add(new_vectors, ["n0", "n1", "n2"])
    writer.remove(["b1", "n1"])  # a base row, and a row added by this same update
    writer.save_delta(tmp_path / "delta")

    replayed = FaissStore.load_files(tmp_path / "base")
    replayed.apply_delta(tmp_path / "delta")
    assert replayed.doc_ids == ["b0", None, "b2", "b3", "b4", "n0", None, "n2"]  # positions as the writer's
    assert len(replayed) == 6
    # brute force over the documents that should be there
    expected = {"b0": base_vectors[0], "b2": base_vectors[2], "b3": base_vectors[3], "b4": base_vectors[4],
                "n0": new_vectors[0], "n2": new_vectors[2]}
    queries = unit_rows(4, 8, 2)
    scores, ids = replayed.search(queries, 6)
    for query, row_scores, row_ids in zip(queries, scores, ids):
        brute = sorted(expected, key=lambda d: -float(expected[d] @ query))
        assert row_ids == brute
        np.testing.assert_allclose(row_scores, [expected[d] @ query for d in brute], rtol=1e-5)
    # the delta holds the two live new vectors only, not the index
    assert np.load(tmp_path / "delta" / "added_vectors.npy").shape == (2, 8)

    replayed.add(unit_rows(1, 8, 3), ["n3"])  # a replayed index journals only what comes after it
    replayed.save_delta(tmp_path / "delta2")
    assert json.loads((tmp_path / "delta2" / "delta.json").read_text()) == {
        "first_row": 8, "doc_ids": ["n3"], "removed_rows": []}

    with pytest.raises(ValueError, match="made from another version"):  # applied twice = on the wrong base
        replayed.apply_delta(tmp_path / "delta")


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat", "HNSW16"])
def test_index_factories_find_each_document_itself(tmp_path, factory):
    vectors = unit_rows(300, 16)
    ids = [f"doc{i}" for i in range(300)]
    index = FaissStore.build(vectors, ids, IndexParams(factory=factory, nprobe=4))
    index.save(tmp_path / "idx")
    loaded = FaissStore.load_files(tmp_path / "idx")
    scores, hits = loaded.search(vectors[:20], k=3)
    assert [h[0] for h in hits] == ids[:20]
    assert np.allclose(scores[:, 0], 1.0, atol=1e-4)


def test_invalid_factory_is_a_clear_error():
    with pytest.raises(ValueError, match="not a valid faiss factory"):
        FaissStore.build(unit_rows(10, 4), [str(i) for i in range(10)], IndexParams(factory="NoSuchIndex"))


def test_incremental_add_and_remove_equal_a_rebuild():
    from faiss.contrib.evaluation import check_ref_knn_with_draws

    vectors = unit_rows(400, 16)
    ids = [f"doc{i}" for i in range(400)]
    incremental = FaissStore.build(vectors[:300], ids[:300])
    incremental.add(vectors[300:], ids[300:])
    incremental.remove(["doc5", "doc350"])
    keep = [i for i in range(400) if i not in (5, 350)]
    rebuilt = FaissStore.build(vectors[keep], [ids[i] for i in keep])
    queries = unit_rows(25, 16, seed=9)
    d_inc, hits_inc = incremental.search(queries, 10)
    d_ref, hits_ref = rebuilt.search(queries, 10)
    position = {d: i for i, d in enumerate(ids)}
    check_ref_knn_with_draws(
        d_ref, np.array([[position[h] for h in row] for row in hits_ref]),
        d_inc, np.array([[position[h] for h in row] for row in hits_inc]),
    )
    assert "doc5" not in {h for row in hits_inc for h in row}
    with pytest.raises(ValueError, match="already indexed"):
        incremental.add(vectors[:1], ["doc7"])


def test_the_search_breadth_settings_reach_the_saved_index_and_widen_hnsw(tmp_path):
    """``index.ef_search`` and ``index.nprobe`` are set on the built index and saved with it; a
    wider HNSW search finds at least as much of the exact top 10 (NumPy) as FAISS's default 16."""
    import faiss

    vectors, queries = unit_rows(3000, 32, 0), unit_rows(100, 32, 1)
    ids = [f"d{i}" for i in range(3000)]
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]

    def recall(ef_search: int) -> float:
        FaissStore.build(vectors, ids, IndexParams(factory="HNSW8", ef_search=ef_search)).save(tmp_path / f"h{ef_search}")
        loaded = FaissStore.load_files(tmp_path / f"h{ef_search}")
        assert faiss.downcast_index(loaded.index.index).hnsw.efSearch == ef_search
        hits = loaded.search(queries, 10)[1]
        return np.mean([len({int(h[1:]) for h in row} & set(top)) / 10 for row, top in zip(hits, exact)])

    assert recall(200) > recall(16)
    FaissStore.build(vectors, ids, IndexParams(factory="IVF16,Flat", nprobe=5)).save(tmp_path / "ivf")
    assert faiss.extract_index_ivf(FaissStore.load_files(tmp_path / "ivf").index).nprobe == 5


def brute_force_top(vectors: np.ndarray, ids: list[str], queries: np.ndarray, k: int) -> list[list[str]]:
    order = np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :k]
    return [[ids[j] for j in row] for row in order]


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat", "HNSW16"])
def test_removals_and_replacements_leave_the_live_documents_as_a_rebuild_finds_them(tmp_path, factory):
    """Before: an IVF index behind IndexIDMap2 answered with the wrong document for every row after
    a removed one (the wrapper's map shifted, the IVF's numbers did not), and HNSW, which cannot
    remove a vector, failed every removal, so every edit or deletion of the freshness loop failed."""
    vectors, ids = unit_rows(320, 16), [f"doc{i}" for i in range(320)]
    store = FaissStore.build(vectors[:300], ids[:300], IndexParams(factory=factory, nprobe=4, ef_search=400))
    store.add(vectors[300:], ids[300:])
    replaced = unit_rows(2, 16, seed=3)
    store.remove(["doc5", "doc150", "doc310", "doc7", "doc8"])
    store.add(replaced, ["doc7", "doc8"])  # an edit: removed, added again with new text
    store.save(tmp_path / "v")
    store.save_delta(tmp_path / "delta")
    replayed = FaissStore.load_files(tmp_path / "v")
    live = [i for i in range(320) if i not in (5, 150, 310, 7, 8)]
    live_vectors, live_ids = np.vstack([vectors[live], replaced]), [ids[i] for i in live] + ["doc7", "doc8"]
    queries = np.vstack([live_vectors[::17], unit_rows(10, 16, seed=9)])
    expected = brute_force_top(live_vectors, live_ids, queries, 10)
    for index in (store, replayed):
        assert len(index) == len(live_ids) and sorted(index.live_ids()) == sorted(live_ids)
        scores, hits = index.search(queries, 10)
        assert hits == expected
        np.testing.assert_allclose(scores, np.sort(queries @ live_vectors.T, axis=1)[:, ::-1][:, :10], atol=1e-5)
        np.testing.assert_allclose(index.vectors(["doc7", "doc200"]), np.vstack([replaced[0], vectors[200]]), atol=1e-6)


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat", "HNSW16"])
def test_an_index_whose_every_document_was_removed_finds_nothing(factory):
    """Before: faiss refused a search for 0 hits (an assertion), so a batch deleting every document
    made the next search fail."""
    vectors, ids = unit_rows(40, 8), [f"doc{i}" for i in range(40)]
    store = FaissStore.build(vectors, ids, IndexParams(factory=factory, nprobe=4))
    store.remove(ids)
    scores, hits = store.search(vectors[:3], 10)
    assert (scores.shape, hits, len(store)) == ((3, 0), [[], [], []], 0)


def test_an_ivf_index_saved_inside_an_id_map_is_taken_out_and_removes_rightly(tmp_path):
    """Indexes built before the fix wrap IVF in IndexIDMap2; with nothing removed yet, the IVF's own
    numbers are the rows, so it is unwrapped when loaded and then removes as a rebuild would."""
    import faiss

    vectors, ids = unit_rows(200, 16), [f"doc{i}" for i in range(200)]
    ivf = faiss.index_factory(16, "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors)
    wrapped = faiss.IndexIDMap2(ivf)
    wrapped.add_with_ids(vectors, np.arange(200, dtype=np.int64))
    (tmp_path / "old").mkdir()
    faiss.write_index(wrapped, str(tmp_path / "old" / "index.faiss"))
    (tmp_path / "old" / "doc_ids.json").write_text(json.dumps(ids))
    store = FaissStore.load_files(tmp_path / "old")
    store.set_search_breadth(4, 16)
    assert not isinstance(store.index, faiss.IndexIDMap)
    store.remove(["doc3"])
    live = [i for i in range(200) if i != 3]
    assert store.search(vectors[100:120], 1)[1] == [[ids[i]] for i in range(100, 120)]
    assert store.search(vectors[live[:50]], 5)[1] == brute_force_top(vectors[live], [ids[i] for i in live],
                                                                      vectors[live[:50]], 5)
