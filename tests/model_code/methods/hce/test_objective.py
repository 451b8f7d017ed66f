"""HCE's training objective (``model_code/methods/hce/objective.py``) against hand computations
written from the paper (arXiv 2502.18877), not from the code: J = L_S + alpha * L_U (Eq. 7), a
hierarchical stream getting Eq. 5 + Eq. 8 with its sampled negatives and a plain stream Eq. 8 alone,
the negatives drawn with the objective's generator from the cache or the encoder, a sampled negative
relevant to the same query masked, and one rank of two scored against the global batch."""


import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model_code.hierarchy.tree import CorpusTree
from model_code.methods.hce.loss import HCELoss
from tests.helpers.hce import TAU, dot, eq5, eq8, neg_log_softmax


class TableEncoder:
    """An "encoder" that looks (text, max length) up in a table of vectors: queries are known at
    length 5 only, passages at length 8 only, so a text encoded at the wrong length is an error."""

    device = torch.device("cpu")

    def __init__(self, table: dict[str, torch.Tensor]):
        self.table = table

    def tokenize(self, texts, length):
        return [(t, length) for t in texts]

    def __call__(self, batch):
        return torch.stack([self.table[t if length == (8 if t.startswith("text") else 5) else None]
                            for t, length in batch])


def test_objective_weighs_streams_and_gives_the_tree_terms_to_hierarchical_streams_only(small):
    """J = L_S + alpha * L_U (Eq. 7): a hierarchical stream gets Eq. 5 + Eq. 8 with its sampled
    negatives (taken from the cache), a plain stream Eq. 8 alone, with a query's other relevant
    document left out of its negatives."""
    import itertools

    import pandas as pd

    from model_code.methods.hce.objective import HCEObjective
    from model_code.training.objectives import Stream
    from model_code.training.pairs import with_positives

    tree, _, _, _, _, _ = small
    g = torch.Generator().manual_seed(4)
    cache = F.normalize(torch.randn(6, 3, generator=g, dtype=torch.float64), dim=-1)
    passages = [f"text of d{i}" for i in range(6)]
    queries = ["qa", "qb", "qc", "qa"]  # "qa" is relevant to d0 and d5
    table = {t: F.normalize(torch.randn(3, generator=g, dtype=torch.float64), dim=0) for t in passages + queries[:3]}
    supervised = with_positives(pd.DataFrame({"query": queries[:3], "doc_id": ["d0", "d3", "d4"]}))
    unsupervised = with_positives(pd.DataFrame({"query": queries, "doc_id": ["d0", "d1", "d3", "d5"]}))
    loss = HCELoss(tree, levels_trained=1, temperature=TAU, n_negatives=2).double()
    streams = [Stream("supervised", itertools.repeat(supervised), 1.0, hierarchical=True),
               Stream("unsupervised", itertools.repeat(unsupervised), 0.3, hierarchical=False)]
    objective = HCEObjective(TableEncoder(table), loss, streams, tree.doc_ids, passages, cache, False, 5, 8,
                             torch.Generator().manual_seed(9))
    total, parts = objective()

    index, valid = loss.sample_negatives(torch.tensor([0, 3, 4]), torch.Generator().manual_seed(9))
    q = [table[t].tolist() for t in queries[:3]]
    p = [table[passages[d]].tolist() for d in (0, 3, 4)]
    supervised_loss = (eq5(q, tree.centroids[0].tolist(), [0, 1, 1])
                       + eq8(q, p, cache[index[:, 0]].tolist(), valid[:, 0].tolist()))
    # unsupervised: rows 0 and 3 share query "qa", so d5 is not a negative of row 0 nor d0 of row 3
    qu = [table[t].tolist() for t in queries]
    pu = [table[passages[d]].tolist() for d in (0, 1, 3, 5)]
    shared = {(0, 3), (3, 0)}
    forward = sum(neg_log_softmax(dot(qu[i], pu[i]) / TAU, [dot(qu[i], pu[j]) / TAU for j in range(4)
                                                             if j != i and (i, j) not in shared]) for i in range(4)) / 4
    backward = sum(neg_log_softmax(dot(pu[i], qu[i]) / TAU, [dot(pu[i], qu[j]) / TAU for j in range(4)
                                                              if j != i and (j, i) not in shared]) for i in range(4)) / 4
    assert float(total.detach()) == pytest.approx(supervised_loss + 0.3 * (forward + backward), rel=1e-9)
    assert set(parts) == {"supervised.level_1", "supervised.level_2", "unsupervised"}
    assert parts["unsupervised"] == pytest.approx(forward + backward, rel=1e-9)


def objective_case(n_negatives: int, encode: bool, relevant: dict[str, list[str]]):
    """Eight documents in leaf clusters {0..3}, {4..7}; one hierarchical stream whose rows pair the
    queries of ``relevant`` with each of their documents; the Eq. 5 + Eq. 8 value by hand."""
    import itertools

    import pandas as pd

    from model_code.methods.hce.objective import HCEObjective
    from model_code.training.objectives import Stream
    from model_code.training.pairs import with_positives

    g = torch.Generator().manual_seed(11)
    tree = CorpusTree(doc_ids=[f"d{i}" for i in range(8)], doc_path=np.array([[0]] * 4 + [[1]] * 4),
                      centroids=[np.array([[1.0, 0.2, 0.0], [0.0, 1.0, 0.5]], dtype=np.float32)],
                      parents=[np.array([0, 0])])
    passages = [f"text of d{i}" for i in range(8)]
    cache = F.normalize(torch.randn(8, 3, generator=g, dtype=torch.float64), dim=-1)
    table = {t: F.normalize(torch.randn(3, generator=g, dtype=torch.float64), dim=0) for t in passages + list(relevant)}
    pairs = with_positives(pd.DataFrame([(q, d) for q, docs in relevant.items() for d in docs], columns=["query", "doc_id"]))
    loss = HCELoss(tree, levels_trained=1, temperature=TAU, n_negatives=n_negatives).double()
    encoder, calls = TableEncoder(table), []
    objective = HCEObjective(encoder, loss, [Stream("s", itertools.repeat(pairs), 1.0)], tree.doc_ids, passages,
                             cache, encode, 5, 8, torch.Generator().manual_seed(9),
                             forward=lambda batch: calls.append(len(batch)) or encoder(batch))  # as a DDP wrapper
    objective.calls = calls
    rows = [int(d[1:]) for d in pairs["doc_id"]]
    index, valid = loss.sample_negatives(torch.tensor(rows), torch.Generator().manual_seed(9),
                                         [{int(d[1:]) for d in p} for p in pairs["positives"]])
    negatives = (torch.stack([table[passages[i]] for i in index.flatten().tolist()]).reshape(*index.shape, 3)
                 if encode and index.numel() else cache[index])
    q = [table[t].tolist() for t in pairs["query"]]
    p = [table[passages[d]].tolist() for d in rows]
    shared = [[i != j and pairs["doc_id"].iat[j] in pairs["positives"].iat[i] for j in range(len(rows))]
              for i in range(len(rows))]
    b = len(rows)
    forward = sum(neg_log_softmax(dot(q[i], p[i]) / TAU, [dot(q[i], p[j]) / TAU for j in range(b) if j != i
                                                           and not shared[i][j]]
                                  + [dot(q[i], n) / TAU for n, ok in zip(negatives[i, 0].tolist(), valid[i, 0]) if ok])
                  for i in range(b)) / b
    backward = sum(neg_log_softmax(dot(p[i], q[i]) / TAU, [dot(p[i], q[j]) / TAU for j in range(b) if j != i
                                                            and not shared[j][i]]) for i in range(b)) / b
    clusters = [0 if d < 4 else 1 for d in rows]
    return objective, eq5(q, tree.centroids[0].tolist(), clusters) + forward + backward, index, valid


@pytest.mark.parametrize(("n_negatives", "encode", "relevant"), [
    (2, False, {"qa": ["d0"], "qb": ["d5"], "qc": ["d2"], "qd": ["d7"]}),
    (2, True, {"qa": ["d0"], "qb": ["d5"], "qc": ["d2"], "qd": ["d7"]}),
    (1, True, {"qa": ["d0"]}),  # a single negative in all, encoded
    (0, True, {"qa": ["d0"], "qb": ["d5"]}),  # none to encode
])
def test_objective_draws_negatives_with_its_generator_and_takes_them_from_cache_or_encoder(n_negatives, encode, relevant):
    """Two of three leaf-cluster siblings per row: which two depends on the objective's generator."""
    objective, want, _, _ = objective_case(n_negatives, encode, relevant)
    total, _ = objective()
    assert float(total.detach()) == pytest.approx(want, rel=1e-9)
    assert sum(objective.calls) == 2 * len(relevant) + (len(relevant) * n_negatives if encode else 0)


def test_objective_masks_a_sampled_negative_relevant_to_the_same_query():
    """All three siblings are drawn; for "qa" (relevant to d0 and d1) the other one must be masked."""
    objective, want, index, valid = objective_case(3, False, {"qa": ["d0", "d1"], "qb": ["d5"]})
    assert not valid[0, 0][index[0, 0] == 1].any() and valid[2].all()
    total, _ = objective()
    assert float(total.detach()) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("hierarchical", [True, False])
def test_objective_on_one_rank_of_two(monkeypatch, hierarchical):
    """Rank 1 of 2 (simulated): it encodes rows 2-3 only and scores them against the gathered batch."""
    from model_code.training import objectives

    objective, _, _, _ = objective_case(0, False, {"qa": ["d0"], "qb": ["d5"], "qc": ["d2"], "qd": ["d7"]})
    objective.streams[0].hierarchical = hierarchical
    table, passages = objective.encoder.table, objective.passages
    q = torch.stack([table[t] for t in ("qa", "qb", "qc", "qd")])
    p = torch.stack([table[passages[d]] for d in (0, 5, 2, 7)])
    other_rank = [q[:2], p[:2]]  # what the all-gather brings from rank 0, queries first
    monkeypatch.setattr(objectives, "local_slice", lambda size: slice(size // 2, size))
    monkeypatch.setattr(objectives, "gather_with_grad", lambda local: torch.cat([other_rank.pop(0), local]))
    total, _ = objective()
    Q, P = q.tolist(), p.tolist()
    forward = [neg_log_softmax(dot(Q[i], P[i]) / TAU, [dot(Q[i], P[j]) / TAU for j in range(4) if j != i])
               for i in (2, 3)]
    backward = [neg_log_softmax(dot(P[i], Q[i]) / TAU, [dot(P[i], Q[j]) / TAU for j in range(4) if j != i])
                for i in (2, 3)]
    level_1 = eq5(Q[2:], objective.loss.centroids[0].detach().tolist(), [0, 1]) if hierarchical else 0.0
    assert float(total.detach()) == pytest.approx(level_1 + sum(forward) / 2 + sum(backward) / 2, rel=1e-9)
