"""IncDSI: add a document to a trained document-id head by optimising one new row (ICML 2023).

The head W (one row per document, no bias) scores a query embedding q by raw dot products
W q. Each existing document j keeps a representative query z_j (the mean of its queries) and its
own logit o_j = w_j . z_j. To add a document with query embeddings Q (natural and/or generated):

    q_bar = mean(Q)
    l1(v) = relu( max_j w_j . q_bar + gamma1 - v . q_bar )^2      the new doc must win on q_bar
    l2(v) = sum_j relu( v . z_j - o_j + gamma2 )^2                  ...without stealing old queries
    L(v)  = lambda1 * l1 + (1 - lambda1) * l2 + lambda2 * ||v||^2

minimised with L-BFGS (lr 1, strong-Wolfe line search) for up to ``max_steps`` outer steps,
stopping when ||v - v_prev|| < ``tolerance`` or L(v) == 0. The max in l1 is computed once, before
optimisation (reference code). Documents are added one after another, so later documents see the
earlier ones as existing rows. The margins are soft goals (the loss trades them off), so a
document counts as *separable* when the constraints hold without margins: it wins its own q_bar
and no existing document's representative query prefers it. When that fails the row is
re-optimised from another initialisation (q_bar scaled to beat the best row) and, if it still
fails, the document is reported as not separable: it is added, never silently.

References: Kishore et al., "IncDSI: Incrementally Updatable Document Retrieval", ICML 2023,
§4.2 and Algorithm 1; reference-code details in shared/design/seed-reference.md §4.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class AdditionParams:
    lambda1: float = 0.5
    gamma1: float = 1.0
    gamma2: float = 1.0
    lambda2: float = 1e-6
    max_steps: int = 30
    tolerance: float = 1e-3
    seed: int = 123


@dataclass
class AdditionResult:
    doc_id: str
    loss: float  # constraint loss with the margins; 0 = every margin met
    steps: int
    milliseconds: float
    separable: bool  # the constraints without margins hold (see ``IncDSIHead._separates``)
    retried: bool


@dataclass
class IncDSIHead:
    """Document-id head: rows W, representative queries Z, own logits o, and the id map."""

    weights: torch.Tensor  # (n, d)
    rep_queries: torch.Tensor  # (n, d)
    doc_ids: list[str]
    own_logits: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.weights = self.weights.detach().float().contiguous()
        self.rep_queries = self.rep_queries.detach().float().contiguous()
        if len(self.weights) != len(self.doc_ids) or self.weights.shape != self.rep_queries.shape:
            raise ValueError("weights, representative queries and doc ids must have one row per document")
        if len(set(self.doc_ids)) != len(self.doc_ids):
            raise ValueError("duplicate document ids in the head")
        self.own_logits = (self.weights * self.rep_queries).sum(1)

    def scores(self, queries: torch.Tensor) -> torch.Tensor:
        return queries.float() @ self.weights.T

    def search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, list[list[str]]]:
        top = self.scores(queries).topk(min(k, len(self.doc_ids)), dim=1)
        return top.values.numpy(), [[self.doc_ids[i] for i in row] for row in top.indices.tolist()]

    # -- updates ------------------------------------------------------------------------------
    def add(self, doc_id: str, queries: torch.Tensor, params: AdditionParams) -> AdditionResult:
        """Optimise and append the row of a new document from its query embeddings (k, d)."""
        if doc_id in self.doc_ids:
            raise ValueError(f"document {doc_id!r} is already in the head (use edit)")
        start = time.perf_counter()
        q_bar = queries.float().mean(0)
        best_other = (self.weights @ q_bar).max() if len(self.doc_ids) else torch.tensor(float("-inf"))
        row, loss, steps = self._optimise(q_bar, best_other, params, init=None)
        separable = self._separates(row, q_bar, best_other)
        retried = not separable
        if retried:  # another start; keep whichever separates, else the lower loss
            row2, loss2, steps2 = self._optimise(q_bar, best_other, params, init="query")
            steps += steps2
            separable2 = self._separates(row2, q_bar, best_other)
            if (separable2, -loss2) > (separable, -loss):
                row, loss, separable = row2, loss2, separable2
        self.weights = torch.cat([self.weights, row[None]])
        self.rep_queries = torch.cat([self.rep_queries, q_bar[None]])
        self.own_logits = torch.cat([self.own_logits, (row @ q_bar)[None]])
        self.doc_ids.append(doc_id)
        return AdditionResult(doc_id, loss, steps, 1000 * (time.perf_counter() - start), separable, retried)

    def _separates(self, row: torch.Tensor, q_bar: torch.Tensor, best_other: torch.Tensor) -> bool:
        """The hard constraints, without margins: the new row wins its own mean query and no existing
        document's representative query now prefers it over that document's own row."""
        return bool(row @ q_bar > best_other) and bool((self.rep_queries @ row < self.own_logits).all())

    def live_ids(self) -> list[str]:
        return list(self.doc_ids)

    def remove_all(self, doc_ids: list[str]) -> int:
        for doc_id in doc_ids:
            self.remove(doc_id)
        return len(doc_ids)

    def remove(self, doc_id: str) -> None:
        try:
            index = self.doc_ids.index(doc_id)
        except ValueError:
            raise KeyError(f"document {doc_id!r} is not in the head") from None
        keep = torch.ones(len(self.doc_ids), dtype=torch.bool)
        keep[index] = False
        self.weights, self.rep_queries, self.own_logits = self.weights[keep], self.rep_queries[keep], self.own_logits[keep]
        del self.doc_ids[index]

    def edit(self, doc_id: str, queries: torch.Tensor, params: AdditionParams) -> AdditionResult:
        """Re-optimise a document's row from new queries (remove, then add against the rest)."""
        self.remove(doc_id)
        return self.add(doc_id, queries, params)

    def _optimise(
        self, q_bar: torch.Tensor, best_other: torch.Tensor, params: AdditionParams, init: str | None
    ) -> tuple[torch.Tensor, float, int]:
        dim = q_bar.shape[0]
        if init == "query":  # a scaled q_bar already beats the best row on q_bar by gamma1
            scale = (best_other + params.gamma1).clamp(min=1e-3) / q_bar.dot(q_bar).clamp(min=1e-12)
            v = (q_bar * scale * 1.01).clone().requires_grad_(True)
        else:  # the reference code's default: a fresh Linear(d, 1) weight, Kaiming-uniform
            generator = torch.Generator().manual_seed(params.seed)
            bound = 1.0 / dim**0.5
            v = ((torch.rand(dim, generator=generator) * 2 - 1) * bound).requires_grad_(True)
        optimizer = torch.optim.LBFGS([v], lr=1, tolerance_change=1e-3, line_search_fn="strong_wolfe")

        def objective() -> torch.Tensor:
            l1 = torch.relu(best_other + params.gamma1 - v @ q_bar) ** 2
            l2 = (torch.relu(self.rep_queries @ v - self.own_logits + params.gamma2) ** 2).sum()
            return params.lambda1 * l1 + (1 - params.lambda1) * l2 + params.lambda2 * v.dot(v)

        def constraint_loss() -> float:
            with torch.no_grad():
                l1 = torch.relu(best_other + params.gamma1 - v @ q_bar) ** 2
                l2 = (torch.relu(self.rep_queries @ v - self.own_logits + params.gamma2) ** 2).sum()
                return float(params.lambda1 * l1 + (1 - params.lambda1) * l2)

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = objective()
            loss.backward()
            return loss

        steps = 0
        for steps in range(1, params.max_steps + 1):
            previous = v.detach().clone()
            optimizer.step(closure)
            if constraint_loss() == 0.0 or (v.detach() - previous).norm() < params.tolerance:
                break
        return v.detach(), constraint_loss(), steps

    # -- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "weights.npy", self.weights.numpy())
        np.save(directory / "rep_queries.npy", self.rep_queries.numpy())
        (directory / "doc_ids.txt").write_text("\n".join(self.doc_ids) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> IncDSIHead:
        directory = Path(directory)
        return cls(
            weights=torch.from_numpy(np.load(directory / "weights.npy")),
            rep_queries=torch.from_numpy(np.load(directory / "rep_queries.npy")),
            doc_ids=(directory / "doc_ids.txt").read_text().splitlines(),
        )
