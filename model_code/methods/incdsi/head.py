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
earlier ones as existing rows.

Where v starts matters as much as the loss: inside the feasible region the loss is only the tiny
lambda2 term, so L-BFGS stops near the first feasible point it reaches. The reference code starts
from a fresh random row (``init: random``), so v ends up little more than q_bar's direction at
the margin. ``init: document`` starts from the document's own embedding, scaled so that it beats
the best existing row on q_bar by exactly gamma1: the constraints are then enforced around what
the encoder knows of the document, which generalises to queries unlike the (few, often
extractive) ones q_bar is built from.

The margins are soft goals (the loss trades them off), so a document counts as *separable* when
the constraints hold without margins: it wins its own q_bar and no existing document's
representative query prefers it. When that fails the row is
re-optimised from another initialisation (q_bar scaled to beat the best row) and, if it still
fails, the document is reported as not separable: it is added, never silently.

References: Kishore et al., "IncDSI: Incrementally Updatable Document Retrieval", ICML 2023,
§4.2 and Algorithm 1; reference-code details in shared/design/seed-reference.md §4.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class AdditionParams:
    lambda1: float = 0.5
    gamma1: float = 1.0
    gamma2: float = 1.0
    lambda2: float = 1e-6
    init: str = "random"  # one of INITS
    max_steps: int = 30
    tolerance: float = 1e-3
    seed: int = 123

    @classmethod
    def from_values(cls, values: object) -> AdditionParams:
        """The fields of ``values`` (e.g. ``params.incdsi``) that name addition parameters."""
        return cls(**{f.name: getattr(values, f.name) for f in fields(cls) if hasattr(values, f.name)})


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread. An addition is thousands of products no larger than
    n x d (d = 384); spreading each over threads costs more in fork/join than it saves, and on a
    busy 2-core machine it waits for the other core every time: the median addition on SciFact
    took 16 ms with 2 threads and 7 ms with 1, with identical rows. The setting is process-wide
    (restored afterwards): other torch work in the same process runs on one thread meanwhile."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


ADDITION_FILE = "addition.json"  # in the head directory: the addition parameters chosen for it
INITS = ("random", "document")  # where a new row's optimisation starts (module docstring)


@dataclass
class AdditionResult:
    doc_id: str
    loss: float  # constraint loss with the margins; 0 = every margin met
    steps: int
    milliseconds: float
    separable: bool  # the constraints without margins hold (see ``IncDSIHead._optimise``)
    retried: bool


def ids_digest(doc_ids: list[str]) -> str:
    """Which head a delta was made from: the digest of its row ids, in order."""
    return hashlib.sha256("\n".join(doc_ids).encode()).hexdigest()


@dataclass
class IncDSIHead:
    """Document-id head: rows W, representative queries Z, own logits o, and the id map."""

    weights: torch.Tensor  # (n, d)
    rep_queries: torch.Tensor  # (n, d)
    doc_ids: list[str]
    own_logits: torch.Tensor = field(init=False)

    _buffers: tuple[torch.Tensor, ...] | None = field(default=None, init=False, repr=False)
    # the journal save_delta writes: rows [0, _kept) are the rows present at load that are still
    # here (rows are only appended or deleted, so they stay a prefix); _dropped, the loaded ones deleted
    _loaded_ids: str = field(default="", init=False, repr=False)  # digest of the ids at load
    _kept: int = field(default=0, init=False, repr=False)
    _dropped: list[str] = field(default_factory=list, init=False, repr=False)

    ACTIVE_ROWS = 256  # l2 rows optimised first (see ``_optimise``)
    ROUNDING = 1e-4  # allowance when checking rows outside the active set (see ``_violated_outside``)

    def __post_init__(self) -> None:
        self.weights = self.weights.detach().float().contiguous()
        self.rep_queries = self.rep_queries.detach().float().contiguous()
        if len(self.weights) != len(self.doc_ids) or self.weights.shape != self.rep_queries.shape:
            raise ValueError("weights, representative queries and doc ids must have one row per document")
        if len(set(self.doc_ids)) != len(self.doc_ids):
            raise ValueError("duplicate document ids in the head")
        self.own_logits = (self.weights * self.rep_queries).sum(1)
        self._kept, self._dropped, self._loaded_ids = len(self.doc_ids), [], ids_digest(self.doc_ids)

    def scores(self, queries: torch.Tensor | np.ndarray) -> torch.Tensor:
        return torch.as_tensor(queries).float() @ self.weights.T

    def search(self, queries: torch.Tensor | np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top-k documents per query embedding by raw dot product (the same contract as
        ``DocIndex.search``, so either can sit behind a ``Retriever``)."""
        top = self.scores(queries).topk(min(k, len(self.doc_ids)), dim=1)
        return top.values.numpy(), [[self.doc_ids[i] for i in row] for row in top.indices.tolist()]

    # -- updates ------------------------------------------------------------------------------
    def add(self, doc_id: str, queries: torch.Tensor, params: AdditionParams,
            document: torch.Tensor | None = None) -> AdditionResult:
        """Optimise and append the row of a new document from its query embeddings (k, d) and,
        for ``init: document``, its own embedding (d,)."""
        if doc_id in self.doc_ids:
            raise ValueError(f"document {doc_id!r} is already in the head (use edit)")
        if params.init not in INITS:
            raise ValueError(f"unknown IncDSI init {params.init!r} (use one of {INITS})")
        if params.init == "document" and document is None:
            raise ValueError(f"init 'document' needs the embedding of document {doc_id!r}")
        with one_thread():
            return self._add(doc_id, queries, params, document)

    def _add(self, doc_id: str, queries: torch.Tensor, params: AdditionParams,
             document: torch.Tensor | None) -> AdditionResult:
        start = time.perf_counter()
        q_bar = queries.float().mean(0)
        best_other = (self.weights @ q_bar).max() if len(self.doc_ids) else torch.tensor(float("-inf"))
        start_row = self._initial_row(params.init, q_bar, best_other, params, document)
        row, loss, steps, separable = self._optimise(start_row, q_bar, best_other, params)
        retried = not separable
        if retried:  # another start; keep whichever separates, else the lower loss
            start_row = self._initial_row("query", q_bar, best_other, params)
            row2, loss2, steps2, separable2 = self._optimise(start_row, q_bar, best_other, params)
            steps += steps2
            if (separable2, -loss2) > (separable, -loss):
                row, loss, separable = row2, loss2, separable2
        self._append(row, q_bar)
        self.doc_ids.append(doc_id)
        return AdditionResult(doc_id, loss, steps, 1000 * (time.perf_counter() - start), separable, retried)

    def _append(self, row: torch.Tensor, q_bar: torch.Tensor) -> None:
        """Append a row in place: the matrices are views of buffers grown geometrically, so an
        addition costs O(d) amortised instead of copying the whole n x d head (a few ms at 5k rows)."""
        n = len(self.doc_ids)
        if self._buffers is None or len(self._buffers[0]) == n or self._buffers[0].data_ptr() != self.weights.data_ptr():
            capacity = max(2 * n, 64)
            self._buffers = tuple(torch.empty((capacity, *t.shape[1:]), dtype=t.dtype)
                                  for t in (self.weights, self.rep_queries, self.own_logits))
            for buffer, current in zip(self._buffers, (self.weights, self.rep_queries, self.own_logits)):
                buffer[:n] = current
        weights, rep_queries, own_logits = self._buffers
        weights[n], rep_queries[n], own_logits[n] = row, q_bar, row @ q_bar
        self.weights, self.rep_queries, self.own_logits = weights[: n + 1], rep_queries[: n + 1], own_logits[: n + 1]

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
        if index < self._kept:
            self._kept -= 1
            self._dropped.append(doc_id)

    def edit(self, doc_id: str, queries: torch.Tensor, params: AdditionParams,
             document: torch.Tensor | None = None) -> AdditionResult:
        """Re-optimise a document's row from new queries (remove, then add against the rest)."""
        self.remove(doc_id)
        return self.add(doc_id, queries, params, document)

    def _initial_row(self, init: str, q_bar: torch.Tensor, best_other: torch.Tensor, params: AdditionParams,
                     document: torch.Tensor | None = None) -> torch.Tensor:
        if init == "query":  # a scaled q_bar already beats the best row on q_bar by gamma1
            scale = (best_other + params.gamma1).clamp(min=1e-3) / q_bar.dot(q_bar).clamp(min=1e-12)
            return q_bar * scale * 1.01
        if init == "document":  # the document's direction, just strong enough to win q_bar by gamma1
            direction = document.float() / document.float().norm().clamp(min=1e-12)
            return direction * (best_other + params.gamma1).clamp(min=1e-3) / direction.dot(q_bar).clamp(min=0.1)
        # the reference code's default: a fresh Linear(d, 1) weight, Kaiming-uniform
        generator = torch.Generator().manual_seed(params.seed)
        bound = 1.0 / q_bar.shape[0] ** 0.5
        return (torch.rand(q_bar.shape[0], generator=generator) * 2 - 1) * bound

    def _optimise(
        self, start: torch.Tensor, q_bar: torch.Tensor, best_other: torch.Tensor, params: AdditionParams
    ) -> tuple[torch.Tensor, float, int, bool]:
        """Minimise L(v) from ``start`` over an active set of l2 rows, with the full problem's result.

        The set starts as the ``ACTIVE_ROWS`` representative queries nearest q_bar plus every row
        violated (margin included) at the start. A row outside the set adds nothing to L or its
        gradient at any v where it is not violated, so as long as no point the optimiser evaluates
        violates an outside row, L-BFGS on the set takes exactly the steps (and stops where) L-BFGS
        on all n rows would. After each run every evaluated point is checked against the outside
        rows; if any is violated there, those rows join the set and the run is repeated *from
        ``start``* (not from where it stopped: that would be another path, and L-BFGS stopping at
        the first feasible point makes the result path-dependent). The returned row therefore is
        the full problem's (the sums are formed over the violated rows only, in row order, so the
        two round alike: the test finds them equal to 1e-5 of the row's norm, in fact bitwise), at
        the cost of one product of all n rows with the evaluated points per run.

        Returns the row, its constraint loss (with margins, over all rows), the outer steps taken
        (over all runs) and whether it *separates*: the constraints hold without margins (it wins
        its own q_bar and no existing document's representative query now prefers it over that
        document's own row)."""
        nearest = (self.rep_queries @ q_bar).topk(min(self.ACTIVE_ROWS, len(self.doc_ids))).indices
        initial = self.rep_queries @ start - self.own_logits  # < 0: the document keeps its own query
        rows = torch.unique(torch.cat([nearest, torch.nonzero(initial + params.gamma2 > 0).flatten()]))
        steps = 0
        while True:
            v, used, points = self._lbfgs(start, q_bar, best_other, rows, params, params.max_steps)
            steps += used
            missing = self._violated_outside(rows, torch.stack(points), params.gamma2)
            if not len(missing):
                break
            rows = torch.unique(torch.cat([rows, missing]))  # sorted: the full problem's row order
        slack = self.rep_queries @ v - self.own_logits
        wins = v @ q_bar
        loss = params.lambda1 * torch.relu(best_other + params.gamma1 - wins) ** 2
        loss = loss + (1 - params.lambda1) * torch.relu(slack + params.gamma2).pow(2).sum()
        return v, float(loss), steps, bool(wins > best_other) and bool((slack < 0).all())

    def _violated_outside(self, rows: torch.Tensor, points: torch.Tensor, gamma2: float) -> torch.Tensor:
        """Rows not in ``rows`` whose l2 term (margin included) is positive at any of ``points``."""
        outside = torch.ones(len(self.doc_ids), dtype=torch.bool)
        outside[rows] = False
        outside = torch.nonzero(outside).flatten()
        if not len(outside):
            return outside
        slack = self.rep_queries[outside] @ points.T - self.own_logits[outside].unsqueeze(1)  # (outside, points)
        # a small allowance: a row at the margin by rounding (the batched product rounds differently
        # from the optimiser's) joins the set too; a row in the set that stays unviolated changes nothing
        return outside[(slack + gamma2 > -self.ROUNDING).any(1)]

    @staticmethod
    def _constraint_loss(v: torch.Tensor, q_bar: torch.Tensor, best_other: torch.Tensor, z: torch.Tensor,
                         own: torch.Tensor, params: AdditionParams) -> float:
        """The loss without the regulariser, over representative queries ``z`` and their logits."""
        h1 = torch.relu(best_other + params.gamma1 - v @ q_bar)
        h2 = torch.relu((z * v).sum(1) - own + params.gamma2)
        return float(params.lambda1 * h1**2 + (1 - params.lambda1) * h2.pow(2).sum())

    @staticmethod
    def _loss_and_gradient(v: torch.Tensor, q_bar: torch.Tensor, best_other: torch.Tensor, z: torch.Tensor,
                           own: torch.Tensor, params: AdditionParams) -> tuple[torch.Tensor, torch.Tensor]:
        """L(v) over the representative queries ``z`` (own logits ``own``) and its gradient in
        closed form, cheaper than autograd for two products:

            dL/dv = -2 lambda1 h1 q_bar + 2 (1 - lambda1) sum_j h2_j z_j + 2 lambda2 v,
            h1 = relu(best_other + gamma1 - v . q_bar),  h2_j = relu(v . z_j - o_j + gamma2)."""
        lambda1, lambda2 = params.lambda1, params.lambda2
        h1 = torch.relu(best_other + params.gamma1 - v @ q_bar)
        h2 = torch.relu((z * v).sum(1) - own + params.gamma2)  # per row, rounded alike for any set size
        on = h2 > 0  # the violated rows only, in row order, so that the sums (and their rounding)
        h2, violated = h2[on], z[on]  # are those of the full problem's, whose other terms are 0
        gradient = -2 * lambda1 * h1 * q_bar + 2 * (1 - lambda1) * (h2 @ violated) + 2 * lambda2 * v
        return lambda1 * h1**2 + (1 - lambda1) * h2.pow(2).sum() + lambda2 * v.dot(v), gradient

    def _lbfgs(self, v: torch.Tensor, q_bar: torch.Tensor, best_other: torch.Tensor, rows: torch.Tensor,
               params: AdditionParams, budget: int) -> tuple[torch.Tensor, int, list[torch.Tensor]]:
        """Up to ``budget`` outer L-BFGS steps on the rows ``rows``; stop when the row moves less
        than ``tolerance`` or every constraint (with margins) is met. Returns the row, the steps
        and every point the loss was evaluated at (the start included)."""
        v = v.clone()
        z, own = self.rep_queries[rows], self.own_logits[rows]
        optimizer = torch.optim.LBFGS([v], lr=1, tolerance_change=1e-3, line_search_fn="strong_wolfe")
        points = [v.clone()]

        @torch.no_grad()
        def closure() -> torch.Tensor:
            points.append(v.clone())
            loss, v.grad = self._loss_and_gradient(v, q_bar, best_other, z, own, params)
            return loss

        steps = 0
        for steps in range(1, budget + 1):
            previous = v.clone()
            optimizer.step(closure)
            points.append(v.clone())
            if self._constraint_loss(v, q_bar, best_other, z, own, params) == 0.0 or (v - previous).norm() < params.tolerance:
                break
        return v, steps, points

    # -- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "weights.npy", self.weights.numpy())
        np.save(directory / "rep_queries.npy", self.rep_queries.numpy())
        (directory / "doc_ids.txt").write_text("\n".join(self.doc_ids) + "\n")

    def save_delta(self, directory: Path) -> None:
        """Write what changed since load: the loaded rows deleted (by id) and the rows appended."""
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "weights.npy", self.weights[self._kept:].numpy())
        np.save(directory / "rep_queries.npy", self.rep_queries[self._kept:].numpy())
        (directory / "delta.json").write_text(json.dumps(
            {"ids_before": self._loaded_ids, "dropped": self._dropped, "doc_ids": self.doc_ids[self._kept:]}))

    def apply_delta(self, directory: Path) -> IncDSIHead:
        """The head a delta written by ``save_delta`` describes, made from this one (the head it
        was saved from): own logits recomputed as a load does, so it equals a full copy exactly."""
        delta = json.loads((directory / "delta.json").read_text())
        if delta["ids_before"] != ids_digest(self.doc_ids):
            raise ValueError(f"{directory}: the delta was made from a head with other document ids than this "
                             f"one ({len(self.doc_ids)} rows); it was made from another version")
        dropped = set(delta["dropped"])
        keep = torch.tensor([d not in dropped for d in self.doc_ids], dtype=torch.bool)
        return IncDSIHead(
            weights=torch.cat([self.weights[keep], torch.from_numpy(np.load(directory / "weights.npy"))]),
            rep_queries=torch.cat([self.rep_queries[keep], torch.from_numpy(np.load(directory / "rep_queries.npy"))]),
            doc_ids=[d for d in self.doc_ids if d not in dropped] + delta["doc_ids"],
        )

    @classmethod
    def load(cls, directory: str | Path) -> IncDSIHead:
        directory = Path(directory)
        if not (directory / "weights.npy").is_file():
            raise FileNotFoundError(f"{directory}: no weights.npy; build the IncDSI head first (retriever.kind: incdsi, then fresh-retriever index)")
        return cls(
            weights=torch.from_numpy(np.load(directory / "weights.npy")),
            rep_queries=torch.from_numpy(np.load(directory / "rep_queries.npy")),
            doc_ids=(directory / "doc_ids.txt").read_text().splitlines(),
        )
