"""Hard negatives: mining never yields a document relevant to its query, the loss with them equals
a hand computation, and training with them runs through the CLI for both methods."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F
import yaml

from model_code.cli import main
from model_code.config import EncoderParams, MiningParams
from model_code.data.ingested import IngestedData
from model_code.hierarchy.tree import build_tree
from model_code.layout import Layout
from model_code.losses.contrastive import bidirectional_infonce
from model_code.methods.hce.loss import HCELoss
from model_code.stages.mine import mine
from model_code.stores.csr_store import CsrStore
from model_code.training.negatives import HardNegatives, RetrievedNegatives
from model_code.training.objectives import ContrastiveObjective, Stream
from tests.conftest import run_stages
from tests.helpers.losses import TAU, by_hand


@pytest.fixture
def multi_relevant() -> IngestedData:
    """Eight documents; train query qa has three relevant documents (one judged in a second qrels
    row with relevance 0 is not relevant), qb one, and the corpus holds a document whose id is
    qb's own (BEIR's identical-id rule); qd is a test query and is never mined."""
    words = ["comet orbit", "comet telescope", "comet nebula", "orbit galaxy", "flour oven", "oven dough",
             "comet orbit telescope", "dough spice"]
    ids = ["d0", "d1", "d2", "d3", "d4", "d5", "qb", "d7"]
    corpus = pd.DataFrame({"doc_id": ids, "title": "", "text": [f"{w} {w}" for w in words]})
    queries = pd.DataFrame({"query_id": ["qa", "qb", "qd"], "text": ["comet orbit telescope", "oven dough", "spice"]})
    train = pd.DataFrame({"query_id": ["qa", "qa", "qa", "qa", "qb"], "doc_id": ["d0", "d1", "d2", "d3", "d5"],
                          "relevance": [1, 2, 1, 0, 1]})
    test = pd.DataFrame({"query_id": ["qd"], "doc_id": ["d7"], "relevance": [1]})
    return IngestedData(corpus, queries, {"train": train, "test": test})


@pytest.mark.parametrize("source", ["bm25", "dense", "both"])
def test_mined_negatives_exclude_every_relevant_document(multi_relevant, tiny_model_dir, source):
    """Searched as deep as the corpus, a query's pool is the corpus minus every document relevant
    to it (all of qa's three, not only its first) and minus its own id; a relevance-0 judgement
    stays a negative."""
    encoder = EncoderParams(model=str(tiny_model_dir), max_query_length=8, max_passage_length=16)
    mined = mine(multi_relevant, MiningParams(source=source, depth=8), encoder)
    pools = mined.groupby("query_id")["doc_id"].agg(set).to_dict()
    corpus = set(multi_relevant.corpus["doc_id"])
    assert pools.keys() == {"qa", "qb"}
    if source == "bm25":  # only documents sharing a term with the query (BM25 score > 0)
        assert pools["qa"] == {"d3", "qb"} and pools["qb"] == {"d4", "d7"}
    else:
        assert pools["qa"] == corpus - {"d0", "d1", "d2"}
        assert pools["qb"] == corpus - {"d5", "qb"}
    assert set(mined["source"]) == ({"bm25", "dense"} if source == "both" else {source})
    assert not mined.duplicated(["query_id", "doc_id"]).any()
    assert (mined.groupby("query_id")["rank"].min() == 0).all()


def test_mining_reads_the_training_judgements_only(multi_relevant, tiny_model_dir):
    """Before: every split's qrels were read, so a test judgement of a training query's document
    took that document out of the query's negatives: test data shaped training."""
    test = pd.DataFrame({"query_id": ["qa"], "doc_id": ["d3"], "relevance": [1]})
    with_test = IngestedData(multi_relevant.corpus, multi_relevant.queries, {**multi_relevant.qrels, "test": test})
    encoder = EncoderParams(model=str(tiny_model_dir), max_query_length=8, max_passage_length=16)
    mined = mine(with_test, MiningParams(source="dense", depth=8), encoder)
    assert set(mined.loc[mined["query_id"] == "qa", "doc_id"]) == set(multi_relevant.corpus["doc_id"]) - {"d0", "d1", "d2"}


class TableEncoder:
    """Texts -> fixed float64 vectors, standing in for the encoder inside the objective."""

    def __init__(self, table: dict[str, torch.Tensor]):
        self.table = table

    def tokenize(self, texts, length):
        return texts

    def __call__(self, texts):
        return torch.stack([self.table[t] for t in texts])


@pytest.fixture
def tiny_batch():
    """Rows (qa, d0), (qb, d1), (qc, d2); qa is also relevant to d5. Pools of two: qa's holds d1
    (qb's positive: a negative of qa, not of qb), qb's holds d5 (a negative of qb, not of qa); qc
    has none, so its two draws are padding."""
    g = torch.Generator().manual_seed(3)
    texts = ["qa", "qb", "qc"] + [f"text {d}" for d in ("d0", "d1", "d2", "d3", "d4", "d5")]
    table = {t: F.normalize(torch.randn(4, generator=g, dtype=torch.float64), dim=0) for t in texts}
    batch = pd.DataFrame({"query": ["qa", "qb", "qc"], "doc_id": ["d0", "d1", "d2"],
                          "positives": [frozenset({"d0", "d5"}), frozenset({"d1"}), frozenset({"d2"})]})
    mined = pd.DataFrame({"query": ["qa", "qa", "qb", "qb"], "doc_id": ["d3", "d1", "d4", "d5"]})
    return table, batch, mined


def test_the_loss_with_hard_negatives_equals_a_hand_computation(tiny_batch):
    table, batch, mined = tiny_batch
    objective = ContrastiveObjective(TableEncoder(table), [Stream("s", itertools.repeat(batch), 1.0)],
                                     lambda d: f"text {d}", TAU, 8, 8, hard_negatives=HardNegatives(mined, 2, seed=0))
    loss, _ = objective()
    q = [table[t].numpy() for t in ("qa", "qb", "qc")]
    p = [table[f"text {d}"].numpy() for d in ("d0", "d1", "d2")]
    hard = [table[f"text {d}"].numpy() for d in ("d3", "d1", "d4", "d5")]  # qc's padding is nobody's negative
    excluded = [[False, False, False, True], [False, True, False, False], [False, False, False, False]]
    assert float(loss) == pytest.approx(by_hand(q, p, hard, excluded), rel=1e-12)
    assert float(loss) > by_hand(q, p, [], [[]] * 3)  # more negatives, a larger loss


def test_draws_pad_short_pools_and_never_draw_a_rows_own_positive(tiny_batch):
    _, batch, mined = tiny_batch
    ids, excluded = HardNegatives(mined, 2, seed=0).draw(batch)
    assert sorted(ids[:2]) == ["d1", "d3"] and sorted(ids[2:4]) == ["d4", "d5"] and ids[4:] == ["d2", "d2"]
    by_id = [dict(zip(ids, row.tolist())) for row in excluded]
    assert by_id[0]["d5"] and by_id[1]["d1"] and not by_id[0]["d1"] and not by_id[1]["d5"]
    assert excluded[:, 4:].all()
    one = HardNegatives(mined, 1, seed=0)
    assert {one.draw(batch)[0][0] for _ in range(20)} == {"d1", "d3"}  # uniform over the pool, not its head


def test_hce_levels_score_the_hard_negatives(tiny_batch):
    """Without centroid levels and sampled negatives every HCE level is the in-batch loss; with
    hard negatives each level adds them exactly as the contrastive loss does."""
    table, _, _ = tiny_batch
    rng = np.random.default_rng(0)
    tree = build_tree([f"d{i}" for i in range(6)], rng.standard_normal((6, 4)).astype(np.float32), 2, 5, 0)
    loss = HCELoss(tree, levels_trained=0, temperature=TAU, n_negatives=0).double()
    q = torch.stack([table[t] for t in ("qa", "qb", "qc")])
    p = torch.stack([table[f"text {d}"] for d in ("d0", "d1", "d2")])
    hard = torch.stack([table[f"text {d}"] for d in ("d3", "d1", "d4", "d5")])
    excluded = torch.tensor([[False, False, False, True], [False, True, False, False], [False] * 4])
    none = torch.zeros(3, len(loss.contrastive_levels), 0, 4, dtype=torch.float64)
    total, _ = loss(q, p, torch.tensor([0, 1, 2]), none, none[..., 0].bool(), hard_negatives=hard,
                    hard_excluded=excluded)
    want = by_hand(q.numpy(), p.numpy(), hard.numpy(), excluded.tolist())
    assert float(total) == pytest.approx(len(loss.contrastive_levels) * want, rel=1e-12)
    assert float(bidirectional_infonce(q, p, TAU, hard_negatives=hard, hard_excluded=excluded)) == pytest.approx(want)
    # rows 1-2 of the global batch, as on a second rank: their rows of the exclusion mask
    local = bidirectional_infonce(q[1:], p[1:], TAU, q, p, offset=1, hard_negatives=hard, hard_excluded=excluded)
    assert float(local) == pytest.approx(by_hand(q.numpy(), p.numpy(), hard.numpy(), excluded.tolist(), [1, 2]))


@pytest.mark.parametrize("method", ["contrastive", "hce"])
def test_training_with_hard_negatives_runs(workspace, method):
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["train"].update(hard_negatives=2, data="supervised", method=method, hce={"mode": "S"})
    run_stages(workspace, params, "ingest", "mine-negatives", *(["cluster"] if method == "hce" else []), "train")
    layout = Layout(workspace)
    mined = json.loads((layout.hard_negatives / "summary.json").read_text())
    assert mined["queries"] > 0 and mined["source"] == "bm25"
    train = json.loads((layout.train_report / "metrics.json").read_text())
    assert train["steps"] == 3 and math.isfinite(train["final_loss"])


def test_nothing_is_mined_when_hard_negatives_are_off(workspace):
    args = ["--params", str(workspace / "params.yaml"), "--root", str(workspace)]
    assert main(["ingest", *args]) == 0 and main(["mine-negatives", *args]) == 0
    assert json.loads((Layout(workspace).hard_negatives / "not_used.json").read_text())["used"] is False


def test_pseudo_query_training_takes_no_hard_negatives():
    from model_code.config import TrainParams

    with pytest.raises(ValueError, match="pseudo-queries only"):
        TrainParams(hard_negatives=1, data="unsupervised")
    TrainParams(hard_negatives=1, method="hce", hce={"mode": "J"})  # J's supervised stream takes them


def draw_batch() -> pd.DataFrame:
    return pd.DataFrame({"query": ["qa", "qb", "qc"], "doc_id": ["p0", "p1", "p2"],
                         "positives": [frozenset({"p0"}), frozenset({"p1"}), frozenset({"p2"})]})


def test_mined_draws_are_the_seeds():
    mined = pd.DataFrame({"query": np.repeat(["qa", "qb", "qc"], 20),
                          "doc_id": [f"n{i}" for i in range(60)]})

    def draws(seed: int) -> list[list[str]]:
        negatives = HardNegatives(mined, 2, seed)
        return [negatives.draw(draw_batch())[0] for _ in range(3)]

    assert draws(7) == draws(7) and draws(7) != draws(8)


def test_retrieved_draws_are_the_seeds():
    """Every document shares every query's only token, so each pool is all 30 non-positives."""
    index = CsrStore.build(sp.csr_matrix(np.ones((30, 1), dtype=np.float32)), [f"n{i}" for i in range(30)])
    queries = sp.csr_matrix(np.ones((3, 1), dtype=np.float32))

    def draws(seed: int) -> list[list[str]]:
        negatives = RetrievedNegatives(index, 2, 30, seed)
        return [negatives.draw(draw_batch(), queries)[0] for _ in range(3)]

    assert draws(7) == draws(7) and draws(7) != draws(8)
