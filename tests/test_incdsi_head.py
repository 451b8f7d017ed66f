"""IncDSI head: initialised from document embeddings, fine-tuned with CE, tuned on a tune split."""

import torch
import torch.nn.functional as F

from model_code.incremental.head import build_head, finetune_head
from model_code.incremental.tuning import f_beta, mrr_at_10, tune_addition


def toy(n_docs=40, per_doc=4, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    docs = F.normalize(torch.randn(n_docs, d, generator=g), dim=-1)
    rows = torch.arange(n_docs).repeat_interleave(per_doc)
    queries = F.normalize(docs[rows] + 0.4 * torch.randn(len(rows), d, generator=g), dim=-1)
    return docs, [f"d{i}" for i in range(n_docs)], queries, rows


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


def test_f_beta_weighs_old_documents():
    assert f_beta(1.0, 1.0) == 1.0 and f_beta(0.0, 0.0) == 0.0
    assert f_beta(0.2, 0.9) > f_beta(0.9, 0.2)


def test_tuning_loop_runs_trials_and_returns_parameters_in_range():
    docs, ids, queries, rows = toy()
    old = rows < 36
    head = build_head(docs[:36], ids[:36], queries[old], rows[old])
    tune_docs = {ids[i]: queries[rows == i][:2] for i in range(36, 40)}
    tune_eval = (torch.cat([queries[rows == i][2:] for i in range(36, 40)]), [ids[i] for i in range(36, 40) for _ in range(2)])
    old_eval = (queries[old], [ids[r] for r in rows[old].tolist()])
    best, history = tune_addition(head, tune_docs, tune_eval, old_eval, trials=2, seed=0)
    assert len(history) == 2 and all(0 <= h["value"] <= 1 for h in history)
    assert 0.05 <= best.lambda1 <= 0.95 and 0 <= best.gamma1 <= 8 and 1e-10 <= best.lambda2 <= 1e-3
    assert len(head.doc_ids) == 36  # trials work on copies
