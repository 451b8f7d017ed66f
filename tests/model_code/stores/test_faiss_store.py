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
