"""The training objectives (``model_code/training/objectives.py``) against hand computations on tiny
batches: HCE's objective with mined hard negatives, and MLR's objective encoding queries and
passages at their own lengths and, on rank 1 of 3 (simulated), scoring its rows against the
gathered batch with a shared positive masked in both directions. (HCE's Eq. 5 + Eq. 8 through the
objective: ``tests/model_code/methods/hce/test_objective.py``; each MLR pooling's loss:
``tests/model_code/methods/mlr/test_training.py``.)"""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from model_code.hierarchy.tree import build_tree
from model_code.methods.hce.loss import HCELoss
from model_code.methods.hce.objective import HCEObjective
from model_code.methods.mlr.objective import MLRObjective
from model_code.training import objectives
from model_code.training.negatives import HardNegatives
from model_code.training.objectives import Stream
from tests.helpers.losses import TAU, by_hand, mlr_by_hand

DOCS = [f"d{i}" for i in range(6)]


class LengthCheckingTable:
    """Texts -> fixed vectors; queries are known at length 5 only and passages ("text ...") at
    length 8 only, so a text tokenized at the wrong length is an error. ``layers``: documents'
    layer vectors (m, dim) for MLR, queries their first (last layer's) vector."""

    device = torch.device("cpu")

    def __init__(self, table: dict[str, torch.Tensor], layers: list[int] | None = None):
        self.table, self.layers = table, layers

    def tokenize(self, texts, length):
        assert all(length == (8 if t.startswith("text") else 5) for t in texts), (texts, length)
        return list(texts)

    def __call__(self, texts):
        return torch.stack([self.table[t] if self.layers is None else self.table[t][0] for t in texts])

    def layer_vectors(self, texts, layers):
        assert layers == self.layers
        return torch.stack([self.table[t] for t in texts])


def test_hce_objective_scores_the_mined_hard_negatives_at_every_level():
    """No centroid level trained and no sampled negatives: every HCE level is the in-batch loss
    plus the rows' hard negatives (the mask keeps out those relevant to the row's query)."""
    g = torch.Generator().manual_seed(3)
    texts = ["qa", "qb", "qc"] + [f"text {d}" for d in DOCS]
    table = {t: F.normalize(torch.randn(4, generator=g, dtype=torch.float64), dim=0) for t in texts}
    batch = pd.DataFrame({"query": ["qa", "qb", "qc"], "doc_id": ["d0", "d1", "d2"],
                          "positives": [frozenset({"d0", "d5"}), frozenset({"d1"}), frozenset({"d2"})]})
    mined = pd.DataFrame({"query": ["qa", "qa", "qb", "qb"], "doc_id": ["d3", "d1", "d4", "d5"]})
    tree = build_tree(DOCS, np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32), 2, 5, 0)
    loss = HCELoss(tree, levels_trained=0, temperature=TAU, n_negatives=0).double()
    objective = HCEObjective(LengthCheckingTable(table), loss, [Stream("s", itertools.repeat(batch), 1.0)], DOCS,
                             [f"text {d}" for d in DOCS], torch.zeros(6, 4, dtype=torch.float64), True, 5, 8,
                             torch.Generator().manual_seed(1), hard_negatives=HardNegatives(mined, 2, seed=0))
    total, _ = objective()
    ids, excluded = HardNegatives(mined, 2, seed=0).draw(batch)  # the same seeded draw
    q = [table[t].numpy() for t in ("qa", "qb", "qc")]
    p = [table[f"text {d}"].numpy() for d in ("d0", "d1", "d2")]
    hard = [table[f"text {d}"].numpy() for d in ids]
    want = by_hand(q, p, hard, excluded.tolist())
    assert want > by_hand(q, p, [], [[]] * 3)  # the hard negatives count
    assert float(total.detach()) == pytest.approx(len(loss.contrastive_levels) * want, rel=1e-12)


def mlr_table(seed: int, texts: list[str]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {t: F.normalize(torch.randn(2, 4, generator=g, dtype=torch.float64), dim=-1) for t in texts}


def test_mlr_objective_encodes_queries_and_passages_at_their_lengths():
    texts = ["qa", "qb", "qc"] + [f"text d{i}" for i in range(3)]
    table = mlr_table(11, texts)
    batch = pd.DataFrame({"query": ["qa", "qb", "qc"], "doc_id": ["d0", "d1", "d2"]})
    batch["positives"] = [frozenset({d}) for d in batch["doc_id"]]
    objective = MLRObjective(LengthCheckingTable(table, [2, 1]), [Stream("s", itertools.repeat(batch), 1.0)],
                             lambda doc: f"text {doc}", TAU, 5, 8, [2, 1], "mean")
    loss, parts = objective()
    q = [table[t][0].numpy() for t in ("qa", "qb", "qc")]
    d = [table[f"text d{i}"].numpy() for i in range(3)]
    assert float(loss.detach()) == pytest.approx(mlr_by_hand(q, d, [], "mean"), rel=1e-12)
    assert parts["s"] == pytest.approx(float(loss.detach()), rel=1e-12)


@pytest.mark.parametrize("pooling", ["multi", "self_contrastive"])
def test_mlr_objective_on_rank_1_of_3_masks_a_shared_positive_in_both_directions(monkeypatch, pooling):
    """Rows (qa, d0) ... (qf, d5); qa and qc are both relevant to d0 and d2. Rank 1 of 3 encodes
    rows 2-3 and scores them against all six, a document by its best layer (for
    self_contrastive, the row's own positive by its last layer, plus 0.5 x the regulariser over
    that positive's layer scores): qc's forward row leaves d0 out, d2's backward row leaves qa out."""
    queries = ["qa", "qb", "qc", "qd", "qe", "qf"]
    texts = queries + [f"text d{i}" for i in range(6)]
    table = mlr_table(7, texts)
    both = frozenset({"d0", "d2"})
    batch = pd.DataFrame({"query": queries, "doc_id": [f"d{i}" for i in range(6)],
                          "positives": [both, frozenset({"d1"}), both, *(frozenset({f"d{i}"}) for i in (3, 4, 5))]})
    objective = MLRObjective(LengthCheckingTable(table, [2, 1]), [Stream("s", itertools.repeat(batch), 1.0)],
                             lambda doc: f"text {doc}", TAU, 5, 8, [2, 1], pooling, reg_weight=0.5)
    q = torch.stack([table[t][0] for t in queries])
    docs = torch.stack([table[f"text d{i}"] for i in range(6)])
    others = [(q[:2], q[4:]), (docs[:2], docs[4:])]  # what the all-gather brings from ranks 0 and 2, queries first
    monkeypatch.setattr(objectives, "local_slice", lambda size: slice(size // 3, 2 * size // 3))
    monkeypatch.setattr(objectives, "gather_with_grad", lambda local: torch.cat([others[0][0], local, others.pop(0)[1]]))
    loss, _ = objective()

    def layers(i, c):  # query i against each layer vector of document c, over tau
        return [float(torch.dot(q[i], v)) / TAU for v in docs[c]]

    def score(i, c):
        return layers(i, c)[0] if pooling == "self_contrastive" and i == c else max(layers(i, c))

    def nll(target, logits):
        return -target + math.log(sum(math.exp(x) for x in logits))

    masked = {(2, 0), (0, 2)}  # (query, document) pairs that are neither target nor negative
    forward = [nll(score(i, i), [score(i, c) for c in range(6) if (i, c) not in masked]) for i in (2, 3)]
    backward = [nll(score(i, i), [score(c, i) for c in range(6) if (c, i) not in masked]) for i in (2, 3)]
    want = sum(forward) / 2 + sum(backward) / 2
    if pooling == "self_contrastive":  # the last layer (listed first) is the target of the positive's own layers
        want += 0.5 * sum(nll(layers(i, i)[0], layers(i, i)) for i in (2, 3)) / 2
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
