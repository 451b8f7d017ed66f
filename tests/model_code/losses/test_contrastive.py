"""The in-batch contrastive loss (``model_code/losses/contrastive.py``): bidirectional InfoNCE
against its definition, and a query's other relevant passages masked out of its negatives in both
directions (HCE's Eq. 8 by hand: ``tests/model_code/methods/hce/test_loss.py``)."""

import pandas as pd
import torch
import torch.nn.functional as F

from model_code.losses.contrastive import bidirectional_infonce
from model_code.training.pairs import batches, false_negatives, with_positives


def test_bidirectional_infonce_matches_definition():
    torch.manual_seed(0)
    q, p = F.normalize(torch.randn(5, 8), dim=-1), F.normalize(torch.randn(5, 8), dim=-1)
    scores = q @ p.T / 0.1
    expected = -torch.log_softmax(scores, dim=1).diag().mean() - torch.log_softmax(scores, dim=0).diag().mean()
    assert torch.allclose(bidirectional_infonce(q, p, 0.1), expected)
    assert bidirectional_infonce(q, q, 0.01) < 0.05  # aligned pairs cost (almost) nothing


def test_a_querys_other_relevant_passages_are_not_its_negatives():
    pairs = with_positives(pd.DataFrame({"query": ["q1", "q2", "q1", "q3"], "doc_id": ["a", "b", "c", "d"]}))
    assert pairs["positives"].tolist() == [frozenset("ac"), frozenset("b"), frozenset("ac"), frozenset("d")]
    batch = next(batches(pairs, 4, seed=0))
    mask = false_negatives(batch)
    rows = {doc: i for i, doc in enumerate(batch["doc_id"])}
    expected = torch.zeros(4, 4, dtype=torch.bool)
    expected[rows["a"], rows["c"]] = expected[rows["c"], rows["a"]] = True
    assert torch.equal(mask, expected)

    torch.manual_seed(0)
    q, p = F.normalize(torch.randn(4, 8), dim=-1), F.normalize(torch.randn(4, 8), dim=-1)
    scores = (q @ p.T / 0.1).masked_fill(expected, float("-inf"))  # the masked pair drops out of both softmaxes
    reference = -torch.log_softmax(scores, 1).diag().mean() - torch.log_softmax(scores, 0).diag().mean()
    assert torch.allclose(bidirectional_infonce(q, p, 0.1, false_negatives=mask), reference)
    assert bidirectional_infonce(q, p, 0.1, false_negatives=mask) < bidirectional_infonce(q, p, 0.1)
