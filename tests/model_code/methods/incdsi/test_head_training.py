"""IncDSI's head before any addition (``model_code/methods/incdsi/head_training.py``): initialised
from the document embeddings (the dense retriever), then fine-tuned with CE, which lowers its loss."""


import torch

from model_code.methods.incdsi.head_training import build_head, finetune_head
from model_code.methods.incdsi.tuning import (
    mrr_at_10,
)
from tests.helpers.incdsi import toy


def test_head_starts_as_the_dense_retriever_and_finetuning_lowers_the_loss():
    docs, ids, queries, rows = toy()
    head = build_head(docs, ids, queries, rows)
    assert torch.equal(head.weights, docs)
    assert torch.allclose(head.rep_queries[0], queries[rows == 0].mean(0))
    relevant = [ids[r] for r in rows.tolist()]
    before = mrr_at_10(head, queries, relevant)
    losses = finetune_head(head, queries, rows, epochs=15, learning_rate=0.05)
    assert losses[-1] < losses[0]
    assert mrr_at_10(head, queries, relevant) > before
