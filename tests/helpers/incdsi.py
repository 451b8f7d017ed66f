"""A toy IncDSI problem: unit document vectors and noisy queries around them, and its query pairs;
and the addition loss written from the paper's formulas."""

import pandas as pd
import torch
import torch.nn.functional as F


def toy(n_docs=40, per_doc=4, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    docs = F.normalize(torch.randn(n_docs, d, generator=g), dim=-1)
    rows = torch.arange(n_docs).repeat_interleave(per_doc)
    queries = F.normalize(docs[rows] + 0.4 * torch.randn(len(rows), d, generator=g), dim=-1)
    return docs, [f"d{i}" for i in range(n_docs)], queries, rows


def toy_pairs(rows, ids, natural_per_doc):
    """(doc_id, query, natural) rows in ``toy`` order: the first ``natural_per_doc`` of each document natural."""
    rank = torch.cat([torch.arange((rows == r).sum()) for r in rows.unique()])
    return pd.DataFrame({"doc_id": [ids[r] for r in rows.tolist()], "query": [f"q{i}" for i in range(len(rows))],
                         "natural": (rank < natural_per_doc).tolist()})


def paper_loss(v, q_bar, best_other, z, own, lambda1, gamma1, gamma2, lambda2):
    """L(v) term by term, with Python loops (no shared code with the head or its optimiser)."""
    l1 = max(0.0, best_other + gamma1 - sum(a * b for a, b in zip(v, q_bar))) ** 2
    l2 = sum(max(0.0, sum(a * b for a, b in zip(v, row)) - o + gamma2) ** 2 for row, o in zip(z, own))
    return lambda1 * l1 + (1 - lambda1) * l2 + lambda2 * sum(a * a for a in v)


def torch_lbfgs(objective, start: torch.Tensor, budget: int, stop=None, tolerance_change: float = 1e-3,
                max_iter: int = 20, history_size: int = 100):
    """torch.optim.LBFGS itself (lr 1, strong-Wolfe line search) on ``objective`` by autograd from
    ``start`` (in its dtype), with the reference code's outer loop: up to ``budget`` step() calls,
    ending after one for which ``stop(row, previous_row)`` gives a reason. Returns every point it
    evaluated (the start first, and each step's row after its evaluations, as numpy arrays), the
    steps taken, and the reason it stopped ("budget" if none)."""
    x = start.detach().clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([x], lr=1, line_search_fn="strong_wolfe", tolerance_change=tolerance_change,
                                  max_iter=max_iter, history_size=history_size)
    points = [start.detach().clone().numpy()]

    def closure():
        optimizer.zero_grad()
        points.append(x.detach().clone().numpy())
        loss = objective(x)
        loss.backward()
        return loss

    for steps in range(1, budget + 1):
        previous = x.detach().clone()
        optimizer.step(closure)
        points.append(x.detach().clone().numpy())
        why = stop(x.detach(), previous) if stop is not None else None
        if why:
            return points, steps, why
    return points, budget, "budget"
