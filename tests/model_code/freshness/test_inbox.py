"""Freshness loop building blocks: the inbox, drift statistics and the decision rule."""

import json
import os
import time

import numpy as np
import pytest

from model_code.cli import main
from model_code.config import DriftThresholds
from model_code.data.tables import IngestError
from model_code.freshness.drift import decide, embedding_drift, population_stability
from model_code.freshness.inbox import Inbox


def write_batch(path, docs, age_seconds: float = 10.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    past = time.time() - age_seconds
    os.utime(path, (past, past))
    return path


DOCS = [{"_id": f"n{i}", "title": f"new {i}", "text": f"a new document number {i} about telescopes"} for i in range(3)]


def test_inbox_accepts_dedupes_and_quarantines(tmp_path):
    inbox = Inbox(tmp_path / "inbox", settle_seconds=5)  # the settled files are 10 s old; a loaded machine
    # can take more than the default 1 s between writing fresh.jsonl and the second look at the inbox
    write_batch(inbox.root / "a.jsonl", DOCS)
    write_batch(inbox.root / "a-copy.jsonl", DOCS)  # same bytes, other name
    (inbox.root / "broken.jsonl").write_text('{"_id": "x", "text": "fine"}\n{not json\n')
    os.utime(inbox.root / "broken.jsonl", (time.time() - 10, time.time() - 10))
    write_batch(inbox.root / "empty-texts.jsonl", [{"_id": "y", "text": ""}])
    write_batch(inbox.root / "fresh.jsonl", DOCS[:1], age_seconds=0)  # may still be being written
    (inbox.root / ".hidden.jsonl").write_text("partial")

    outcome = inbox.receive()
    assert [b.name for b in outcome["accepted"]] == ["a-copy.jsonl"]  # sorted order: first of the twins wins
    assert outcome["duplicates"] == ["a.jsonl"]
    assert sorted(outcome["quarantined"]) == ["broken.jsonl", "empty-texts.jsonl"]
    error = json.loads((inbox.quarantine_dir / "broken.jsonl.error.json").read_text())["error"]
    assert "broken.jsonl:2: malformed JSON" in error
    assert "no valid document" in json.loads((inbox.quarantine_dir / "empty-texts.jsonl.error.json").read_text())["error"]
    assert sorted(p.name for p in inbox.pending()) == []  # fresh.jsonl still settling, dot-file ignored
    assert (inbox.root / "fresh.jsonl").exists() and (inbox.root / ".hidden.jsonl").exists()

    batch = inbox.batches()[0]
    assert batch.path.exists() and batch.documents == 3 and batch.batch_id == batch.sha256[:16]
    assert inbox.batch(batch.batch_id) == batch
    assert inbox.read(batch).documents["doc_id"].tolist() == ["n0", "n1", "n2"]
    assert inbox.receive() == {"accepted": [], "duplicates": [], "quarantined": []}


def test_submit_documents_cli(tmp_path):
    good = write_batch(tmp_path / "good.jsonl", DOCS)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    assert main(["submit-documents", str(good), "--root", str(tmp_path)]) == 0
    assert (tmp_path / "inbox" / "good.jsonl").read_bytes() == good.read_bytes()
    assert main(["submit-documents", str(good), "--root", str(tmp_path)]) == 0  # name taken: kept under another
    assert len(list((tmp_path / "inbox").glob("good*.jsonl"))) == 2
    assert main(["submit-documents", str(bad), "--root", str(tmp_path)]) == 2
    assert not (tmp_path / "inbox" / "bad.jsonl").exists()
    with pytest.raises(IngestError, match="expected a JSON object"):
        Inbox(tmp_path / "inbox").submit(bad)
    fresh = tmp_path / "fresh.jsonl"  # a file dropped by hand this instant waits to settle; a submitted one does not
    fresh.write_text(good.read_text().replace('"n', '"f'))
    assert main(["submit-documents", str(fresh), "--root", str(tmp_path)]) == 0
    (tmp_path / "inbox" / "by-hand.jsonl").write_text(good.read_text().replace('"n', '"h'))
    outcome = Inbox(tmp_path / "inbox").receive()
    accepted = [b.name for b in outcome["accepted"]]  # the two goods: one accepted, one a duplicate
    assert accepted[0] == "fresh.jsonl" and len(accepted) == 2 and len(outcome["duplicates"]) == 1
    assert (tmp_path / "inbox" / "by-hand.jsonl").exists()  # still settling


def test_population_stability_and_ks_separate_shifted_vectors():
    from model_code.freshness.drift import DriftReference

    rng = np.random.default_rng(0)
    centroids = np.eye(4, 16, dtype=np.float32)

    def around(rows, cluster, noise):
        v = centroids[cluster] + noise * rng.normal(size=(rows, 16))
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    train = np.concatenate([around(100, c, 0.2) for c in range(4)])
    similarity = (train @ centroids.T).max(axis=1)
    reference = DriftReference(centroids=centroids, train_similarity=similarity, train_share=np.full(4, 0.25),
                               base_ids=[], canary_qrels={}, canary_vectors=np.zeros((0, 16)), canary_at_training={})
    same = embedding_drift(reference, np.concatenate([around(10, c, 0.2) for c in range(4)]))
    far = embedding_drift(reference, around(40, 0, 3.0))  # far from every centroid: a new topic
    one_cluster = embedding_drift(reference, around(40, 0, 0.2))  # in distribution, but all one topic
    assert same["similarity_ks"] < 0.35 and same["cluster_psi"] < 0.1
    assert far["similarity_ks"] > 0.9 and far["mean_similarity"] < 0.5 < same["mean_similarity"]
    assert one_cluster["cluster_psi"] > 0.5 and one_cluster["similarity_ks"] < 0.35
    assert population_stability(np.full(4, 0.25), np.array([0, 0, 0])) > 0  # finite with empty clusters


def stats(**overrides):
    base = {"batch_documents": 50, "added_since_training": 100, "volume_ratio": 0.02, "canary_mrr_drop": 0.0,
            "unseparable_share": 0.0, "batch_similarity_ks": 0.1, "batch_cluster_psi": 0.05,
            "cumulative_similarity_ks": 0.1, "cumulative_cluster_psi": 0.05}
    return {**base, **overrides}


def test_decide_thresholds():
    thresholds = DriftThresholds()
    assert decide(stats(), thresholds, 5) == ("incremental", [])
    action, reasons = decide(stats(volume_ratio=0.3, batch_similarity_ks=0.9), thresholds, 5)
    assert action == "retrain" and len(reasons) == 2 and reasons[0].startswith("volume_ratio 0.3000 > 0.25")
    assert decide(stats(canary_mrr_drop=thresholds.max_canary_mrr_drop + 0.01), thresholds, 5)[0] == "retrain"
    assert decide(stats(unseparable_share=0.5), thresholds, 5)[0] == "retrain"
    # a 3-document batch is too small for its own KS/PSI to count, and so is a 3-document total
    small = stats(batch_documents=3, added_since_training=3, batch_similarity_ks=1.0, cumulative_cluster_psi=9.0)
    assert decide(small, thresholds, 5) == ("incremental", [])
