"""The commit log (``model_code/stores/milvus_commits.py``) on a Milvus Lite file: what one log
writes another reads (the rows, not the writer's memory); commits chain by the version they extend;
a revocation takes a commit out of the chain and of what ``gc`` keeps; another deployment's commits
are left out; the log is a collection of its own, which a lineage never committed to lacks and
``gc`` drops with its lineage; a record too long for a row is refused by name."""

import json

import numpy as np
import pytest
import scipy.sparse as sp

import model_code.stores.milvus_commits as commits_module
from model_code.config import IndexParams
from model_code.stores.milvus_commits import RECORD_CHARS, TRIM_CHUNK, Commit, CommitLog, written_by
from model_code.stores.milvus_store import MilvusSparseStore, MilvusStore, MilvusStoreError, all_rows, sweep
from tests.helpers.vectors import unit_rows


def mine(commit: Commit) -> bool:
    return commit.run_id.startswith("mine")


def commit(version: str, delta_of: str, write_set: int, run_id: str | None = None, alias: str = "champion") -> Commit:
    return Commit(version=version, delta_of=delta_of, delta_uri=f"runs:/{version}/retriever_delta", run_id=run_id or f"mine-{version}",
                  alias=alias, tags={"retriever_version": version}, write_sets={"c": [write_set]})


@pytest.fixture(params=["dense", "sparse"])
def store(request, tmp_path):
    settings = IndexParams(backend="milvus", milvus={"uri": str(tmp_path / "milvus.db")})
    if request.param == "dense":
        return MilvusStore.build(unit_rows(6, 8, seed=0), [f"d{i}" for i in range(6)], settings)
    return MilvusSparseStore.build(sp.random(6, 40, density=0.3, format="csr", random_state=0) + sp.eye(6, 40),
                                   [f"d{i}" for i in range(6)], settings)


def test_commits_chain_revocations_take_them_out_and_other_deployments_are_left_out(store):
    writer = CommitLog(store.connection, mine)
    writer.commit(commit("v0001", "base", 11))
    writer.commit(commit("v0002", "v0001", 12))
    writer.commit(commit("v0001", "base", 13, run_id="theirs-v0001"))  # another registry sharing the collection
    writer.commit(commit("v0009", "v0002", 14, alias="challenger"))

    reader = CommitLog(store.connection, mine).read()
    assert sorted(reader.commits) == ["v0001", "v0002", "v0009"]
    assert reader.commits["v0001"].write_sets == {"c": [11]}  # ours, not theirs
    assert reader.next_after("base", "champion").version == "v0001"
    assert reader.next_after("v0001", "champion").version == "v0002"
    assert reader.next_after("v0002", "champion") is None  # v0009 extends the challenger
    assert reader.ancestors("v0002") == {"v0002", "v0001", "base"}
    assert reader.served_write_sets()["c"] == {11, 12, 14}

    CommitLog(store.connection, mine).read().revoke(reader.commits["v0002"], "rolled back")
    assert not reader.is_revoked("v0002")  # not read yet
    reader.read()
    assert reader.is_revoked("v0002") and not reader.is_revoked("v0001")
    assert reader.next_after("v0001", "champion") is None
    assert reader.served_write_sets() == {"c": {11, 14}}

    writer.commit(commit("v0003", "v0001", 15))  # the branch after the rollback
    assert reader.read().next_after("v0001", "champion").version == "v0003"


def test_the_log_is_a_collection_of_its_own_made_by_the_first_commit_and_dropped_with_its_lineage(store):
    connection = store.connection
    ids, queries = sorted(store.live_ids()), store.vectors(["d0", "d1"])
    before = store.search(queries, 6)
    log = CommitLog(connection, mine)
    assert not log.exists() and log.read().commits == {}  # never committed to: no log, nothing made by reading
    assert connection.collection + "_commits" not in connection.client.list_collections()
    log.commit(commit("v0001", "base", 11))
    log.read().revoke(log.commits["v0001"], "rolled back")
    assert connection.collection + "_commits" in connection.client.list_collections()
    assert sorted(store.live_ids()) == ids  # the lineage's rows and answers are untouched
    after = store.search(queries, 6)
    assert after[1] == before[1] and np.allclose(after[0], before[0])

    uri, prefix = connection.uri, connection.collection.rsplit("_", 2)[0]
    kept = sweep(uri, {connection.collection: set(store.visible)}, prefix, grace_s=0)
    assert kept["collections_dropped"] == [] and CommitLog(connection, mine).read().is_revoked("v0001")
    dropped = sweep(uri, {}, prefix, grace_s=0)  # the log first: a stop in between leaves no log unfound
    assert dropped["collections_dropped"] == [connection.collection + "_commits", connection.collection]
    assert not CommitLog(connection, mine).exists()


def test_a_log_whose_lineage_is_gone_is_dropped_and_one_of_a_kept_lineage_stays(tmp_path):
    settings = IndexParams(backend="milvus", milvus={"uri": str(tmp_path / "milvus.db")})
    gone, kept = (MilvusStore.build(unit_rows(3, 8, seed=s), ["a", "b", "c"], settings) for s in (0, 1))
    for store in (gone, kept):
        CommitLog(store.connection, mine).commit(commit("v0001", "base", 11))
    client, prefix = gone.connection.client, gone.connection.collection.rsplit("_", 2)[0]
    client.drop_collection(gone.connection.collection)  # as a stop between the two drops of an older gc left it
    swept = sweep(gone.connection.uri, {kept.connection.collection: set(kept.visible)}, prefix, grace_s=0)
    assert swept["collections_dropped"] == [gone.connection.collection + "_commits"]
    assert sorted(CommitLog(kept.connection, mine).read().commits) == ["v0001"]


def test_a_record_too_long_for_a_row_is_refused_naming_the_collection(store):
    long = Commit(version="v0001", delta_of="base", delta_uri="runs:/1/retriever_delta", run_id="mine-1", alias="champion",
                  tags={"promotion": "x" * 70000})
    with pytest.raises(MilvusStoreError, match=rf"{store.connection.collection}_commits.*a row holds 65535"):
        CommitLog(store.connection, mine).commit(long)
    assert CommitLog(store.connection, mine).read().commits == {}


def test_written_by_names_the_write_sets_the_parent_chain_does_not_hold(tmp_path):
    def saved(name: str, file: str, collection: str, write_sets: list[int]):
        (tmp_path / name / "index").mkdir(parents=True)
        (tmp_path / name / "index" / file).write_text(json.dumps(
            {"uri": "u", "collection": collection, "write_sets": write_sets}))
        return tmp_path / name

    base = saved("base", "milvus.json", "a", [1, 2])
    delta = saved("v0001", "milvus_delta.json", "a", [3])
    whole = saved("v0002", "milvus.json", "a", [1, 2, 3, 4])  # a whole copy lists every write-set it sees
    head = saved("head", "milvus.json", "b", [7])
    assert written_by(delta, [base]) == {"a": [3]}
    assert written_by(whole, [base, delta]) == {"a": [4]}
    assert written_by(head, [base]) == {"b": [7]}


def test_the_log_of_a_collection_a_restarted_server_holds_released_is_read(store):
    CommitLog(store.connection, mine).commit(commit("v0001", "base", 11))
    log = store.connection.collection + "_commits"
    store.connection.client.release_collection(log)  # as a restarted server holds it
    reader = CommitLog(store.connection, mine).read()
    assert sorted(reader.commits) == ["v0001"]
    store.connection.client.release_collection(log)  # restarted again, under a reader that had loaded it
    assert sorted(reader.read().commits) == ["v0001"]
    CommitLog(store.connection, mine).commit(commit("v0002", "v0001", 12))
    assert sorted(reader.read().commits) == ["v0001", "v0002"]


def test_a_poll_with_nothing_new_reads_no_row_and_one_after_a_commit_reads_the_log(store, monkeypatch):
    """What keeps a following server's poll cheap: a count, and the rows only when it changed."""
    reads = []

    def counted(*args):
        reads.append(args)
        return all_rows(*args)

    monkeypatch.setattr(commits_module, "all_rows", counted)
    writer, reader = CommitLog(store.connection, mine), CommitLog(store.connection, mine)
    writer.commit(commit("v0001", "base", 11))
    assert sorted(reader.read().commits) == ["v0001"] and len(reads) == 1
    reader.read()
    reader.read()
    assert len(reads) == 1  # nothing new: counted, not read
    writer.commit(commit("v0002", "v0001", 12))
    assert sorted(reader.read().commits) == ["v0001", "v0002"] and len(reads) == 2


def test_a_trim_deletes_only_its_commits_and_a_reader_sees_a_commit_made_while_as_many_rows_went(store):
    """The trap a count alone falls into: two rows trimmed, a trim row and a commit written
    between two polls leave the log as many rows as before."""
    writer, reader = CommitLog(store.connection, mine), CommitLog(store.connection, mine)
    for number in range(1, 4):
        writer.commit(commit(f"v000{number}", f"v000{number - 1}" if number > 1 else "base", 10 + number))
    writer.commit(commit("v0001", "base", 21, run_id="theirs-v0001"))  # another registry's: never ours to trim
    writer.read().revoke(writer.commits["v0003"], "rolled back")
    assert sorted(reader.read().commits) == ["v0001", "v0002", "v0003"]
    rows = lambda: len(all_rows(store.connection.client, store.connection.collection + "_commits", "", ["row"], 30))
    before = rows()

    writer.read().trim([writer.commits["v0001"], writer.commits["v0002"]], "registered")
    writer.commit(commit("v0004", "v0003", 14))
    assert rows() == before
    assert sorted(reader.read().commits) == ["v0003", "v0004"] and reader.is_revoked("v0003")
    theirs = CommitLog(store.connection, lambda c: c.run_id.startswith("theirs")).read()
    assert sorted(theirs.commits) == ["v0001"]  # another registry's rows are left
    writer.trim([], "nothing settled")  # writes no trim row
    assert rows() == before


def test_a_reader_that_read_between_a_trim_row_and_its_delete_reads_the_log_again(store, monkeypatch):
    """A poll between a trim's row and its delete counts the rows about to go; one trimmed and one
    committed after it leave the counts as that poll took them in, so only reading whole again sees
    the commit."""
    writer, reader = CommitLog(store.connection, mine), CommitLog(store.connection, mine)
    writer.commit(commit("v0001", "base", 11))
    writer.commit(commit("v0002", "v0001", 12))
    writer.read()
    delete = type(writer.connection.client).delete

    def read_first(client, *args, **kwargs):  # the reader polls after the trim row, before the delete
        assert sorted(reader.read().commits) == ["v0001", "v0002"]
        return delete(client, *args, **kwargs)

    monkeypatch.setattr(type(writer.connection.client), "delete", read_first)
    writer.trim([writer.commits["v0001"]], "registered")
    monkeypatch.undo()
    writer.commit(commit("v0003", "v0002", 13))
    assert sorted(reader.read().commits) == ["v0002", "v0003"]


def test_a_trim_row_reads_as_a_revocation_of_no_commit_to_a_server_older_than_trimming(store):
    """Servers of versions registered before trimming existed run their own copy of this module,
    which reads every row that is not a commit as a revocation of its record's ``revokes``."""
    writer = CommitLog(store.connection, mine)
    for number in range(1, 4):
        writer.commit(commit(f"v000{number}", f"v000{number - 1}" if number > 1 else "base", 10 + number))
    writer.read().trim([writer.commits["v0001"]], "registered")
    rows = all_rows(store.connection.client, store.connection.collection + "_commits", "", ["kind", "record"], 30)
    records = [json.loads(row["record"]) for row in rows]
    revoked = {record["revokes"] for row, record in zip(rows, records, strict=True) if row["kind"] != 1}
    assert revoked and not revoked & {record.get("run_id") for record in records}  # a run id no commit has


def test_a_trim_of_many_commits_writes_a_row_per_chunk_each_short_enough_for_a_record(store, monkeypatch):
    writer, reader = CommitLog(store.connection, mine), CommitLog(store.connection, mine)
    for number in range(1, 6):
        writer.commit(commit(f"v000{number}", f"v000{number - 1}" if number > 1 else "base", 10 + number))
    monkeypatch.setattr(commits_module, "TRIM_CHUNK", 2)
    writer.read().trim([writer.commits[f"v000{n}"] for n in range(1, 5)], "registered")
    rows = all_rows(store.connection.client, store.connection.collection + "_commits", "", ["kind", "record"], 30)
    trims = [json.loads(row["record"])["versions"] for row in rows if row["kind"] == 3]
    assert sorted(trims) == [["v0001", "v0002"], ["v0003", "v0004"]]
    assert sorted(reader.read().commits) == ["v0005"]
    # a full chunk of the longest names a chain makes in years (v and 7 digits), 19-digit row ids and gc's reason fits
    worst = {"versions": ["v" + "9" * 7] * TRIM_CHUNK, "rows": [2**63 - 1] * TRIM_CHUNK, "revokes": "",
             "reason": "registered more than 86400 s ago and held by what their alias names"}
    assert len(json.dumps(worst, separators=(",", ":"), sort_keys=True)) < RECORD_CHARS


def test_a_version_name_written_twice_is_its_unrevoked_commit_whatever_the_row_order(store, monkeypatch):
    """A rollback revokes v0002; an update from a host that never saw that name writes v0002 again.
    A Milvus cluster hands out row ids from a block per proxy, so the revoked commit's row may have
    the higher id: the reader kept it (the later row) and served the registered version instead."""
    log = CommitLog(store.connection, mine)
    log.commit(commit("v0001", "base", 11))
    log.commit(commit("v0002", "v0001", 12, run_id="mine-old"))
    log.read().revoke(log.commits["v0002"], "rolled back")
    log.commit(commit("v0002", "v0001", 13, run_id="mine-new"))
    rows = all_rows(store.connection.client, log.connection.collection, "", ["row", "kind", "record"], 30.0)
    old, new = (next(r for r in rows if '"mine-old"' in r["record"] and r["kind"] == commits_module.COMMIT),
                next(r for r in rows if '"mine-new"' in r["record"]))
    old["row"], new["row"] = new["row"], old["row"]  # as a cluster may number them
    monkeypatch.setattr(CommitLog, "_rows_if_grown", lambda self: sorted(rows, key=lambda r: r["row"]))
    reader = CommitLog(store.connection, mine).read()
    assert reader.commits["v0002"].run_id == "mine-new" and not reader.is_revoked("v0002")
    assert reader.next_after("v0001", "champion").write_sets == {"c": [13]}
