"""The milvus store (``model_code/stores/milvus_store.py``) on Milvus Lite: every kind with vectors
answers as it does on FAISS Flat; versions are views (a crashed write is never seen, copies and
deltas stay apart); bad input and an unreachable server fail fast, naming the URI and collection;
``sweep`` removes what no version refers to. The store protocol itself runs in
``tests/conformance/test_store_protocol.py``; the served loop in ``tests/end_to_end/test_milvus_loop.py``."""

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from pymilvus import MilvusClient

from model_code.config import IndexParams, load_params
from model_code.retrievers import load_retriever
from model_code.retrievers.base import SearchHit
from model_code.stores import load_store
from model_code.stores.milvus_store import MilvusStore, MilvusStoreError, point_alias, sweep
from model_code.versions.apply import upsert_documents
from model_code.versions.chain import RetrieverVersions
from tests.conftest import REPOSITORY, run_stages, tiny_params
from tests.helpers.batches import write_batch
from tests.helpers.vectors import unit_rows


def settings(uri: str, **milvus) -> IndexParams:
    return IndexParams(backend="milvus", milvus={"uri": uri, **milvus})


QUERIES = ["stars planets galaxies", "recipe oven flour", "stocks bonds interest", "patient dose clinical trial",
           "melody chord rhythm", "football goal league", "comet nebula telescope orbit"]


NEW = {"_id": "new-volcano", "title": "volcano", "text": "lava magma eruption crater ash plume"}


# svdr: sparse rows, its binary token bags (beta) or its encoder's document vectors (full)
KINDS = {"dense": {}, "incdsi": {}, "mlr": {}, "svdr": {"svdr": {"search": "beta"}},
         "svdr-full": {"svdr": {"search": "full"}}}


# the dense kinds again on a Milvus server (2.3: no sparse vectors for svdr); incdsi and mlr write to a
# server's collection through the calls dense makes, so they are in the slow tier
ON_A_SERVER = ["dense-on-standalone", pytest.param("incdsi-on-standalone", marks=pytest.mark.slow),
               pytest.param("mlr-on-standalone", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", [*KINDS, *ON_A_SERVER])
def test_each_kind_with_vectors_answers_as_on_faiss_flat(tmp_path, beir_dir, tiny_model_dir, name, request):
    """The same workspace built twice, on FAISS Flat (svdr: SciPy CSR) and on a Milvus Lite
    collection (FLAT; svdr: a sparse inverted index) or a Milvus server's (``-on-standalone``), then
    the same document added to both: the same top-10 ids and scores per query each time (the tiny
    corpus has no tied scores). The Milvus versions hold references to collections, no index file;
    IncDSI's addition wrote its optimised head row into the head's collection."""
    uri = str(tmp_path / "milvus.db")
    if name.endswith("-on-standalone"):
        name, uri = name.removesuffix("-on-standalone"), request.getfixturevalue("milvus_standalone")
    kind, built, added = name.split("-")[0], {}, {}
    for backend in ("faiss", "milvus"):
        params = tiny_params(beir_dir, tiny_model_dir, train={"enabled": False}, retriever={"kind": kind, **KINDS[name]},
                             index={"backend": backend, "milvus": {"uri": uri}})
        layout = run_stages(tmp_path / backend, params, "ingest", "querygen", "train", "index")
        built[backend] = load_retriever(layout.retriever, layout.encoder).search(QUERIES, 10)
        upsert_documents(layout, load_params(layout.root / "params.yaml"), write_batch(tmp_path / "new.jsonl", [NEW]))
        retriever = RetrieverVersions(layout).load()
        added[backend] = retriever.search([*QUERIES, "volcano lava magma eruption"], 10)
    for on_faiss, on_milvus in zip(built["faiss"] + added["faiss"], built["milvus"] + added["milvus"]):
        if kind == "svdr":  # a sparse search on Milvus leaves out the rows scoring 0 (ties, kept in row order on CSR)
            on_faiss = SearchHit(*map(list, zip(*[(d, s) for d, s in zip(on_faiss.doc_ids, on_faiss.scores) if s > 0])))
        assert on_milvus.doc_ids == on_faiss.doc_ids
        np.testing.assert_allclose(on_milvus.scores, on_faiss.scores, rtol=1e-5, atol=1e-6)
    assert added["milvus"][-1].doc_ids[0] == "new-volcano"
    saved = tmp_path / "milvus" / "models" / "retriever"
    assert {p.name for p in (saved / "index").iterdir()} == {"milvus.json", "store.json"}
    if kind == "incdsi":
        assert (saved / "head_index" / "milvus.json").is_file()
        np.testing.assert_allclose(retriever.head_index.vectors(["new-volcano"])[0], retriever.head.weights[-1].numpy(),
                                   rtol=1e-6)


def test_a_write_no_saved_version_lists_is_never_seen_and_sweep_removes_it(tmp_path, milvus_server):
    """A process that adds and removes documents on the loopback server and is killed (-9) before
    it saves: a version loaded afterwards sees the collection as it was saved; the rows that process
    wrote (vectors and tombstones) are in the collection but invisible, and ``sweep`` deletes them."""
    uri = milvus_server
    vectors, ids = unit_rows(30, 8, seed=0), [f"d{i}" for i in range(30)]
    store = MilvusStore.build(vectors, ids, settings(uri, collection_prefix="sweep_test"))  # other tests share the server
    store.save(tmp_path / "v1")
    script = f"""
import os, signal, numpy as np
from model_code.stores import load_store
store = load_store({str(tmp_path / 'v1')!r})
store.add(np.eye(8, dtype=np.float32)[:2], ["new-a", "new-b"])
store.remove(["d0", "d1"])
os.kill(os.getpid(), signal.SIGKILL)  # before the version that lists this write is saved
"""
    killed = subprocess.run([sys.executable, "-c", script], cwd=REPOSITORY, capture_output=True, text=True,
                            check=False)
    assert killed.returncode == -9, killed.stderr
    reloaded = load_store(tmp_path / "v1")
    assert reloaded.live_ids() == ids
    np.testing.assert_array_equal(reloaded.search(vectors[:3], 1)[1], [["d0"], ["d1"], ["d2"]])
    client = MilvusClient(uri=uri)
    collection = reloaded.connection.collection
    assert len(client.query(collection, filter="", output_fields=["row"], limit=100)) == 34  # 2 rows, 2 tombstones

    swept = sweep(uri, referenced={collection: set(reloaded.visible)}, prefix="sweep_test", grace_s=0)
    assert swept == {"collections_dropped": [], "rows_deleted": 4}
    rows = client.query(collection, filter="", output_fields=["doc_id", "removes"], limit=100)
    assert sorted(r["doc_id"] for r in rows) == sorted(ids) and all(r["removes"] == -1 for r in rows)


@pytest.mark.parametrize("engine", ["lite", "standalone"])
def test_copies_and_deltas_are_views_of_one_collection(tmp_path, engine, request):
    """A copy's writes stay out of the original and the other way round; a delta replayed on the
    version it was made from gives the writer's view, on any other version it is refused; on Milvus
    Lite and on a Milvus server (whose scalar indexes are of other types, and which returns the
    primary key of a hit under another name)."""
    uri = str(tmp_path / "milvus.db") if engine == "lite" else request.getfixturevalue("milvus_standalone")
    vectors, ids = unit_rows(20, 8, seed=1), [f"d{i}" for i in range(20)]
    store = MilvusStore.build(vectors, ids, settings(uri))
    store.save(tmp_path / "v1")
    copy = store.copy()
    copy.add(unit_rows(1, 8, seed=2), ["in-copy"])
    store.add(unit_rows(1, 8, seed=3), ["in-original"])
    store.remove(["d5"])
    assert "in-copy" not in store.live_ids() and "in-original" not in copy.live_ids() and "d5" in copy.live_ids()
    store.save_delta(tmp_path / "v2")
    replayed = load_store(tmp_path / "v1")
    replayed.apply_delta(tmp_path / "v2")
    assert replayed.live_ids() == store.live_ids()
    with pytest.raises(ValueError, match="made from another version"):
        replayed.apply_delta(tmp_path / "v2")  # v2 again on v2


def test_bad_input_fails_naming_the_collection_and_uri(tmp_path):
    uri = str(tmp_path / "milvus.db")
    store = MilvusStore.build(unit_rows(5, 8, seed=4), [f"d{i}" for i in range(5)], settings(uri))
    name = store.connection.collection
    with pytest.raises(ValueError, match=rf"Milvus at {uri}, collection '{name}': vectors of dimension 4"):
        store.add(unit_rows(1, 4, seed=5), ["short"])
    with pytest.raises(ValueError, match=r"already indexed: \['d1'\]"):
        store.add(unit_rows(1, 8, seed=5), ["d1"])
    with pytest.raises(KeyError, match="not in the index"):
        store.remove(["never-added"])
    store.save(tmp_path / "v1")
    MilvusClient(uri=uri).drop_collection(name)
    with pytest.raises(MilvusStoreError, match=rf"collection '{name}': the collection does not exist"):
        load_store(tmp_path / "v1")


def test_an_unreachable_server_fails_within_the_timeout_naming_it(tmp_path):
    start = time.monotonic()
    with pytest.raises(MilvusStoreError, match=r"Milvus at http://127.0.0.1:9: cannot connect .*make milvus-up"):
        MilvusStore.build(unit_rows(3, 8, seed=6), ["a", "b", "c"], settings("http://127.0.0.1:9", timeout_s=2))
    assert time.monotonic() - start < 10


def test_an_approximate_collection_finds_the_exact_top_10(tmp_path):
    """HNSW with index.ef_search and IVF_FLAT probing every list against FLAT on the same rows."""
    uri = str(tmp_path / "milvus.db")
    vectors, queries = unit_rows(2000, 16, seed=7), unit_rows(20, 16, seed=8)
    ids = [f"d{i}" for i in range(2000)]
    exact = MilvusStore.build(vectors, ids, settings(uri)).search(queries, 10)[1]
    hnsw = MilvusStore.build(vectors, ids, settings(uri, index_type="HNSW")).search(queries, 10)[1]
    ivf = MilvusStore.build(vectors, ids, IndexParams(backend="milvus", nprobe=8,
                                                      milvus={"uri": uri, "index_type": "IVF_FLAT", "nlist": 8}))
    recall = lambda found: np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)])
    assert recall(hnsw) >= 0.95
    assert recall(ivf.search(queries, 10)[1]) == 1.0
    ivf.save(tmp_path / "ivf")
    reference = json.loads((tmp_path / "ivf" / "milvus.json").read_text())
    assert (reference["index_type"], reference["nprobe"]) == ("IVF_FLAT", 8)


def test_searches_through_an_alias_never_fail_while_it_moves_between_collections(tmp_path, milvus_server):
    """A client searching through the deployment's alias, from another thread, while it is pointed
    back and forth between two lineages' collections: every answer whole from one of them, none failed."""
    first = MilvusStore.build(unit_rows(50, 8, seed=9), [f"a{i}" for i in range(50)], settings(milvus_server))
    second = MilvusStore.build(unit_rows(50, 8, seed=10), [f"b{i}" for i in range(50)], settings(milvus_server))
    alias = f"alias_test_{tmp_path.name[-8:].replace('-', '_')}"
    point_alias(milvus_server, first.connection.collection, alias)
    client, query = MilvusClient(uri=milvus_server), unit_rows(1, 8, seed=11)
    answers, failures, stop = [], [], threading.Event()

    def search():
        while not stop.is_set():
            try:
                [hits] = client.search(alias, data=list(query), limit=5, output_fields=["doc_id"])
                answers.append({hit["entity"]["doc_id"][0] for hit in hits})
            except Exception as error:  # noqa: BLE001 - any failure is what the test counts
                failures.append(repr(error))

    reader = threading.Thread(target=search)
    reader.start()
    for turn in range(20):
        point_alias(milvus_server, (second if turn % 2 == 0 else first).connection.collection, alias)
        time.sleep(0.05)
    stop.set()
    reader.join()
    assert not failures and len(answers) > 20
    assert all(letters in ({"a"}, {"b"}) for letters in answers) and {"a"} in answers and {"b"} in answers
    assert client.describe_alias(alias)["collection_name"] == first.connection.collection  # the last move: first


def test_a_version_searches_after_its_server_restarted(tmp_path):
    """A restarted Milvus Lite server holds its collections released (a search is refused until
    they are loaded again): loading a version loads its collection, rows written just before the stop
    (not flushed) included."""
    import socket

    from orchestration import milvus_lite

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uri = milvus_lite.up(tmp_path / "server", port)
    try:
        vectors = unit_rows(22, 8, seed=12)
        store = MilvusStore.build(vectors[:20], [f"d{i}" for i in range(20)], settings(uri))
        store.add(vectors[20:], ["late0", "late1"])  # inserted, not flushed
        store.save(tmp_path / "v1")
        milvus_lite.down(tmp_path / "server")
        milvus_lite.up(tmp_path / "server", port)
        assert load_store(tmp_path / "v1").search(vectors[[0, 1, 20, 21]], 1)[1] == [["d0"], ["d1"], ["late0"], ["late1"]]
    finally:
        milvus_lite.down(tmp_path / "server")


def test_a_sparse_row_with_no_weight_is_refused_naming_the_document(tmp_path):
    """Milvus stores no empty sparse vector: such a document fails by id, and nothing is written."""
    import scipy.sparse as sp

    from model_code.stores.milvus_store import MilvusSparseStore

    rows = sp.csr_matrix(np.array([[0.0, 1.5, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32))
    with pytest.raises(ValueError, match=r"no nonzero weight .*\['empty'\]"):
        MilvusSparseStore.build(rows, ["kept", "empty"], settings(str(tmp_path / "milvus.db")))
    store = MilvusSparseStore.build(rows[:1], ["kept"], settings(str(tmp_path / "milvus.db")))
    assert store.search(sp.csr_matrix([[0.0, 2.0, 0.0]]), 5)[1] == [["kept"]]
    assert (store.vectors(["kept"]) != rows[:1]).nnz == 0


def test_sparse_vectors_on_a_milvus_server_before_2_4_fail_naming_the_version(milvus_standalone):
    """Milvus 2.3 has no sparse vector field: svdr's collection is refused before anything is
    created, naming the server's version (its own error named "field 104")."""
    import scipy.sparse as sp

    from model_code.stores.milvus_store import MilvusSparseStore

    client = MilvusClient(uri=milvus_standalone)
    before = set(client.list_collections())
    rows = sp.csr_matrix(np.array([[0.0, 1.5, 0.0]], dtype=np.float32))
    with pytest.raises(MilvusStoreError, match=rf"Milvus at {milvus_standalone}, .*: sparse vectors \(retriever kind "
                                               r"svdr\) need Milvus 2.4 or later; this server runs v2\.3\.5"):
        MilvusSparseStore.build(rows, ["kept"], settings(milvus_standalone))
    assert set(client.list_collections()) == before


IDLE_CLIENT = """
import time, numpy as np
from model_code.config import IndexParams
from model_code.stores.milvus_store import MilvusStore
store = MilvusStore.build(np.eye(4, dtype=np.float32), list("abcd"), IndexParams(backend="milvus", milvus={"uri": %r}))
time.sleep(35)  # pymilvus pings every 10 s by default: the third early ping drew GOAWAY too_many_pings
print(store.search(np.eye(4, dtype=np.float32)[:1], 1)[1])
"""


def test_an_idle_client_of_a_local_server_is_not_dropped_for_pinging(milvus_server):
    """The store's client of a server on this machine pings it as rarely as the Milvus Lite server
    allows (before: after 30 s idle the server dropped the connection with GOAWAY too_many_pings
    in the log, and the next request reconnected)."""
    done = subprocess.run([sys.executable, "-c", IDLE_CLIENT % milvus_server], cwd=REPOSITORY, capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[['a']]" and "too_many_pings" not in done.stderr, done.stderr[-2000:]


def test_a_commit_log_a_writer_stopped_making_or_a_server_restart_released_is_read_on_a_server(milvus_standalone,
                                                                                                 monkeypatch):
    """On a Milvus server (Lite loads a collection without an index and queries a released one, so
    only a server shows either): a log created without its index (a writer stopped between the
    create and the index) is indexed and loaded by the next writer; a log the server released
    under a reader that had loaded it is loaded again by that reader's next read."""
    from model_code.stores.milvus_commits import Commit, CommitLog

    store = MilvusStore.build(unit_rows(3, 8, seed=0), ["a", "b", "c"], settings(milvus_standalone))
    client, log = MilvusClient(uri=milvus_standalone), store.connection.collection + "_commits"
    with monkeypatch.context() as stopped:  # the writer stopped after the create, before the index and the load
        stopped.setattr(CommitLog, "_open", lambda self: None)
        CommitLog(store.connection, lambda c: True)._create()
    assert log in client.list_collections() and not client.list_indexes(log)

    def commit(version: str, delta_of: str) -> Commit:
        return Commit(version=version, delta_of=delta_of, delta_uri="runs:/-/delta", run_id=f"run-{version}",
                      alias="champion")

    assert CommitLog(store.connection, lambda c: True).read().commits == {}  # the reader indexes and loads it
    CommitLog(store.connection, lambda c: True).commit(commit("v0001", "base"))
    reader = CommitLog(store.connection, lambda c: True).read()
    assert sorted(reader.commits) == ["v0001"]
    client.release_collection(log)  # as the server holds it after a restart
    assert sorted(reader.read().commits) == ["v0001"]
    CommitLog(store.connection, lambda c: True).commit(commit("v0002", "v0001"))
    assert sorted(reader.read().commits) == ["v0001", "v0002"]
