"""Build and fine-tune the IncDSI document-id head from a trained encoder's embeddings.

Rows start as the documents' embeddings (so the dense encoder and the head agree: at
initialisation the head *is* the dense retriever) and are fine-tuned with cross-entropy over
document ids on the old documents' queries (natural + generated), encoder frozen, query
embeddings cached — the IncDSI paper's §4.1 classifier, trained in seconds on CPU. Each
document's representative query is the mean of its queries' embeddings (its own embedding when it
has none), which the addition constraints protect.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model_code.methods.incdsi.head import IncDSIHead


def build_head(doc_vectors: torch.Tensor, doc_ids: list[str], query_vectors: torch.Tensor, query_rows: torch.Tensor) -> IncDSIHead:
    """``query_rows[i]`` is the row (document) that query ``i`` belongs to."""
    sums = torch.zeros_like(doc_vectors).index_add_(0, query_rows, query_vectors)
    counts = torch.bincount(query_rows, minlength=len(doc_ids)).unsqueeze(1).to(doc_vectors.dtype)
    rep = torch.where(counts > 0, sums / counts.clamp(min=1), doc_vectors)
    return IncDSIHead(doc_vectors.clone(), rep, list(doc_ids))


def finetune_head(
    head: IncDSIHead, query_vectors: torch.Tensor, query_rows: torch.Tensor,
    epochs: int = 20, learning_rate: float = 1e-3, batch_size: int = 128, seed: int = 42,
) -> list[float]:
    """Cross-entropy over document ids with the encoder frozen; returns the loss per epoch."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.nn.Parameter(head.weights.clone())
    optimizer = torch.optim.AdamW([weights], lr=learning_rate, weight_decay=0.0)
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(query_vectors), generator=generator)
        total = 0.0
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            loss = F.cross_entropy(query_vectors[batch] @ weights.T, query_rows[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        losses.append(total / len(order))
    head.weights = weights.detach()
    head.own_logits = (head.weights * head.rep_queries).sum(1)
    return losses


def train_head(
    doc_vectors: torch.Tensor, doc_ids: list[str], query_vectors: torch.Tensor, query_doc_ids: list[str],
    epochs: int, learning_rate: float, seed: int = 42,
) -> tuple[IncDSIHead, torch.Tensor, list[float]]:
    """``build_head`` then ``finetune_head`` from queries labelled by document id; returns the
    head, each query's row and the loss per epoch."""
    row = {d: i for i, d in enumerate(doc_ids)}
    rows = torch.tensor([row[d] for d in query_doc_ids], dtype=torch.long)
    head = build_head(doc_vectors, doc_ids, query_vectors, rows)
    losses = finetune_head(head, query_vectors, rows, epochs, learning_rate, seed=seed) if epochs else []
    return head, rows, losses
