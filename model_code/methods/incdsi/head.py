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
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import faiss
import numpy as np
import torch

from model_code.methods.incdsi.lbfgs import HISTORY_SIZE, MAX_ITER, minimise


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
    constraint_candidates: int | None = None  # None: every row (see ``IncDSIHead._candidates``)

    @classmethod
    def from_values(cls, values: object) -> AdditionParams:
        """The fields of ``values`` (e.g. ``params.incdsi``) that name addition parameters."""
        return cls(**{f.name: getattr(values, f.name) for f in fields(cls) if hasattr(values, f.name)})


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch (and FAISS, whose searches find a pruned addition's candidates) on one thread. An
    addition is thousands of products no larger than n x d (d = 384); spreading each over threads
    costs more in fork/join than it saves, and on a busy 2-core machine it waits for the other core
    every time: the median addition on SciFact took 16 ms with 2 threads and 7 ms with 1, with
    identical rows. The settings are process-wide (restored afterwards): other torch and FAISS work
    in the same process runs on one thread meanwhile."""
    threads, faiss_threads = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        faiss.omp_set_num_threads(faiss_threads)


ADDITION_FILE = "addition.json"  # in the head directory: the addition parameters chosen for it
DOC_IDS_FILE = "doc_ids.json"  # in the head directory: the id of each row, in row order
INITS = ("random", "document")  # where a new row's optimisation starts (module docstring)


@dataclass
class AdditionResult:
    doc_id: str
    loss: float  # constraint loss with the margins; 0 = every margin met
    steps: int
    milliseconds: float
    separable: bool  # the constraints without margins hold (see ``IncDSIHead._optimise``)
    retried: bool


class RowSearch:
    """Approximate maximum-inner-product search over the rows of a head matrix, so that an addition
    finds its candidate rows without a product with all n rows.

    FAISS IVF-Flat over inner products with sqrt(n) lists (at least 39 rows each, FAISS's k-means
    minimum; fewer lists than ``benchmarks.scale``'s 4 sqrt(n), as a search here wants hundreds of
    rows, not 10), its k-means on at most 64 rows a list (the lists need only be even: about 3 s at
    100k rows on 2 cores). A search for the best k probes enough lists to read about ``SCANNED`` x k
    rows. Appended rows join their nearest list; a removed row is removed from the index. Rows keep
    a fixed id (their slot): as rows are only appended (with new, larger slots) or removed, slots
    increase with the row position, so a search maps the slots it finds to the current positions
    by binary search, and a removal needs no rebuild."""

    SCANNED = 8

    def __init__(self, vectors: torch.Tensor):
        n, d = vectors.shape
        self.trained, self.lists = n, max(1, min(int(n**0.5), n // 39))
        self.index = faiss.index_factory(d, f"IVF{self.lists},Flat", faiss.METRIC_INNER_PRODUCT)
        self.index.cp.max_points_per_centroid = 64
        matrix = np.ascontiguousarray(vectors.numpy())
        self.index.train(matrix)
        # each row's id in the index, in row order (increasing): a view of a buffer grown
        # geometrically, so that an append does not copy every slot
        self.slots = self._buffer = np.arange(n)
        self.index.add_with_ids(matrix, self.slots)

    def __len__(self) -> int:
        return len(self.slots)

    def append(self, vector: torch.Tensor) -> None:
        n = len(self.slots)
        slot = self.slots[-1] + 1 if n else 0
        self.index.add_with_ids(np.ascontiguousarray(vector.numpy()[None]), np.array([slot]))
        if n == len(self._buffer):
            self._buffer = np.concatenate([self.slots, np.empty(max(n, 64), dtype=self.slots.dtype)])
        self._buffer[n] = slot
        self.slots = self._buffer[: n + 1]

    def remove(self, position: int) -> None:
        self.index.remove_ids(self.slots[position: position + 1])
        self.slots = self._buffer = np.delete(self.slots, position)

    def search(self, query: torch.Tensor, k: int) -> np.ndarray:
        """Positions of (approximately) the k rows with the largest inner product with ``query``."""
        self.index.nprobe = min(self.lists, math.ceil(self.lists * self.SCANNED * k / max(len(self), 1)))
        _, slots = self.index.search(np.ascontiguousarray(query.numpy()[None]), k)
        return np.searchsorted(self.slots, slots[0][slots[0] >= 0])


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
    # approximate searches over (rep_queries, weights) for pruned additions, built on first use
    _search: tuple[RowSearch, RowSearch] | None = field(default=None, init=False, repr=False)
    _ids: set[str] = field(default_factory=set, init=False, repr=False)  # doc_ids as a set: O(1) "already in the head"

    ACTIVE_ROWS = 256  # l2 rows optimised first (see ``_optimise``)
    ROUNDING = 1e-4  # allowance when checking rows outside the active set (see ``_violated_outside``)

    def __post_init__(self) -> None:
        self.weights = self.weights.detach().float().contiguous()
        self.rep_queries = self.rep_queries.detach().float().contiguous()
        if len(self.weights) != len(self.doc_ids) or self.weights.shape != self.rep_queries.shape:
            raise ValueError("weights, representative queries and doc ids must have one row per document")
        self._ids = set(self.doc_ids)
        if len(self._ids) != len(self.doc_ids):
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
        if doc_id in self._ids:
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
        candidates = self._candidates(q_bar, params.constraint_candidates)
        rivals = self.weights if candidates is None else self.weights[candidates]
        best_other = (rivals @ q_bar).max() if len(rivals) else torch.tensor(float("-inf"))
        start_row = self._initial_row(params.init, q_bar, best_other, params, document)
        row, loss, steps, separable = self._optimise(start_row, q_bar, best_other, params, candidates)
        retried = not separable
        if retried:  # another start; keep whichever separates, else the lower loss
            start_row = self._initial_row("query", q_bar, best_other, params)
            row2, loss2, steps2, separable2 = self._optimise(start_row, q_bar, best_other, params, candidates)
            steps += steps2
            if (separable2, -loss2) > (separable, -loss):
                row, loss, separable = row2, loss2, separable2
        self._append(row, q_bar)
        self.doc_ids.append(doc_id)
        self._ids.add(doc_id)
        return AdditionResult(doc_id, loss, steps, 1000 * (time.perf_counter() - start), separable, retried)

    def _candidates(self, q_bar: torch.Tensor, count: int | None) -> torch.Tensor | None:
        """The rows an addition considers, in row order; None for every row (``count`` None, or a
        head of at most ``count`` rows: nothing to prune, the exact problem).

        With ``count`` C: the C representative queries nearest q_bar (the l2 constraints at risk:
        the new row must score high on q_bar, so on queries near it) and the C rows scoring highest
        on q_bar (l1's best other row), each by an approximate search (``RowSearch``, built on
        first use and rebuilt when the head has more than doubled since, so that its lists still
        partition the rows evenly)."""
        n = len(self.doc_ids)
        if count is None or n <= count:
            return None
        if self._search is None or len(self._search[0]) != n or n > 2 * self._search[0].trained:
            self._search = (RowSearch(self.rep_queries), RowSearch(self.weights))
        return torch.from_numpy(np.unique(np.concatenate([search.search(q_bar, count) for search in self._search])))

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
        if self._search is not None:
            self._search[0].append(q_bar)
            self._search[1].append(row)

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
        self._ids.remove(doc_id)
        if self._search is not None:
            for search in self._search:
                search.remove(index)
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
        self, start: torch.Tensor, q_bar: torch.Tensor, best_other: torch.Tensor, params: AdditionParams,
        candidates: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, float, int, bool]:
        """Minimise L(v) from ``start`` over an active set of l2 rows, with the full problem's result.

        The full problem is over every row, or over the rows ``candidates`` (sorted) when given:
        then the rows outside them are ignored throughout (the problem of a head made of the
        candidate rows only). The set starts as the ``ACTIVE_ROWS`` representative queries nearest
        q_bar plus every row violated (margin included) at the start. A row outside the set adds
        nothing to L or its gradient at any v where it is not violated, so as long as no point the
        optimiser evaluates violates an outside row, L-BFGS on the set takes exactly the steps (and
        stops where) L-BFGS on all the rows would. After each run every evaluated point is checked
        against the outside rows; if any is violated there, those rows join the set and the run is
        repeated *from ``start``* (not from where it stopped: that would be another path, and
        L-BFGS stopping at the first feasible point makes the result path-dependent). The returned
        row therefore is the full problem's (the sums are formed over the violated rows only, in
        row order, so the two round alike: the test finds them equal to 1e-5 of the row's norm, in
        fact bitwise), at the cost of one product of all the rows with the evaluated points per run.

        Returns the row, its constraint loss (with margins, over all the rows), the outer steps
        taken (over all runs) and whether it *separates*: the constraints hold without margins (it
        wins its own q_bar and no existing document's representative query among the rows now
        prefers it over that document's own row)."""
        if candidates is None:
            universe, z, own = torch.arange(len(self.doc_ids)), self.rep_queries, self.own_logits
        else:
            universe, z, own = candidates, self.rep_queries[candidates], self.own_logits[candidates]
        if len(universe) <= self.ACTIVE_ROWS:  # every row in the set (a pruned addition's few candidates)
            rows = universe
        else:
            nearest = universe[(z @ q_bar).topk(self.ACTIVE_ROWS).indices]
            initial = z @ start - own  # < 0: the document keeps its own query
            rows = torch.unique(torch.cat([nearest, universe[torch.nonzero(initial + params.gamma2 > 0).flatten()]]))
        steps = 0
        while True:
            every = len(rows) == len(universe)  # no row outside the set to check afterwards
            z_rows, own_rows = (z, own) if every else (self.rep_queries[rows], self.own_logits[rows])
            v, used, points = self._lbfgs(start, q_bar, best_other, z_rows, own_rows, params, params.max_steps)
            steps += used
            if every:
                break
            missing = self._violated_outside(rows, points, params.gamma2, candidates)
            if not len(missing):
                break
            rows = torch.unique(torch.cat([rows, missing]))  # sorted: the full problem's row order
        # in numpy: a few microseconds an operation, where torch's dispatch takes tens on a slow machine;
        # an einsum, not BLAS, whose threads one_thread() does not hold to one
        slack = np.einsum("ij,j->i", z.numpy(), v.numpy()) - own.numpy()
        wins, best = float(v.numpy() @ q_bar.numpy()), float(best_other)
        margins = np.maximum(slack + params.gamma2, 0)
        loss = params.lambda1 * max(best + params.gamma1 - wins, 0.0) ** 2 + (1 - params.lambda1) * float(margins @ margins)
        return v, loss, steps, wins > best and bool((slack < 0).all())

    def _violated_outside(self, rows: torch.Tensor, points: torch.Tensor, gamma2: float,
                          candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Rows not in ``rows`` (among ``candidates``, default every row) whose l2 term (margin
        included) is positive at any of ``points``."""
        universe = torch.arange(len(self.doc_ids)) if candidates is None else candidates
        outside = universe[~torch.isin(universe, rows)]
        if not len(outside):
            return outside
        slack = self.rep_queries[outside] @ points.T - self.own_logits[outside].unsqueeze(1)  # (outside, points)
        # a small allowance: a row at the margin by rounding (the batched product rounds differently
        # from the optimiser's) joins the set too; a row in the set that stays unviolated changes nothing
        return outside[(slack + gamma2 > -self.ROUNDING).any(1)]

    def _lbfgs(self, v: torch.Tensor, q_bar: torch.Tensor, best_other: torch.Tensor, z: torch.Tensor,
               own: torch.Tensor, params: AdditionParams, budget: int) -> tuple[torch.Tensor, int, torch.Tensor]:
        """Up to ``budget`` outer L-BFGS steps on the rows whose representative queries and own
        logits are ``z`` and ``own`` (``lbfgs.minimise``:
        torch.optim.LBFGS(lr=1, tolerance_change=1e-3, line_search_fn='strong_wolfe'), the
        reference code's, compiled); stop when the row moves less than ``tolerance`` or every
        constraint (with margins) is met. Returns the row, the steps and every point the loss was
        evaluated at (the start included), one a row."""
        def float64(tensor: torch.Tensor) -> np.ndarray:
            return np.ascontiguousarray(tensor.numpy(), dtype=np.float64)

        coefficients = np.array([float(best_other), params.lambda1, params.gamma1, params.gamma2, params.lambda2])
        row, steps, points = minimise(float64(v), float64(q_bar), coefficients, float64(z), float64(own), budget,
                                      params.tolerance, MAX_ITER, HISTORY_SIZE)
        return torch.from_numpy(row).to(self.weights.dtype), int(steps), torch.from_numpy(points).to(self.weights.dtype)

    # -- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "weights.npy", self.weights.numpy())
        np.save(directory / "rep_queries.npy", self.rep_queries.numpy())
        # JSON, as the stores keep ids: one per line read back an emptied head as one id "", and an
        # id holding a line break ("\r", "\u2028") as another id or two
        (directory / DOC_IDS_FILE).write_text(json.dumps(self.doc_ids))

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
            doc_ids=(json.loads((directory / DOC_IDS_FILE).read_text()) if (directory / DOC_IDS_FILE).is_file()
                     else (directory / "doc_ids.txt").read_text().splitlines()),  # a head saved before the JSON file
        )
