"""IncDSI's head (``model_code/methods/incdsi/head.py``) checked against independent computations
(paper §4.2, reference-code facts in shared/design/seed-reference.md §4), each written from the
paper's formulas rather than the code:

    l1(v) = relu(max_j w_j . q_bar + gamma1 - v . q_bar)^2
    l2(v) = sum_j relu(v . z_j - o_j + gamma2)^2,      o_j = w_j . z_j
    L(v)  = lambda1 l1 + (1 - lambda1) l2 + lambda2 ||v||^2

and its additions: the new document wins its queries, old documents keep theirs, removals, edits,
persistence, and a delta that gives the head a whole copy gives.
"""

import copy
import json
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from model_code.methods.incdsi.head import AdditionParams, IncDSIHead
from tests.helpers.incdsi import paper_loss, torch_lbfgs


def make_head(n: int = 200, d: int = 32, seed: int = 0) -> IncDSIHead:
    generator = torch.Generator().manual_seed(seed)
    rows = F.normalize(torch.randn(n, d, generator=generator), dim=-1) * 5
    queries = F.normalize(rows + 0.3 * torch.randn(n, d, generator=generator), dim=-1)
    return IncDSIHead(rows, queries, [f"d{i}" for i in range(n)])


def own_rank_ok(head: IncDSIHead) -> torch.Tensor:
    return head.scores(head.rep_queries).argmax(1) == torch.arange(len(head.doc_ids))


def test_added_documents_win_their_queries_without_stealing_old_ones():
    head = make_head()
    before = own_rank_ok(head)
    generator = torch.Generator().manual_seed(1)
    params = AdditionParams(lambda1=0.5, gamma1=1.0, gamma2=1.0, lambda2=1e-6)
    new_queries = {}
    for t in range(10):
        direction = F.normalize(torch.randn(32, generator=generator), dim=0)
        queries = F.normalize(direction + 0.1 * torch.randn(5, 32, generator=generator), dim=-1)
        result = head.add(f"new{t}", queries, params)
        new_queries[f"new{t}"] = queries.mean(0)
        assert result.steps >= 1 and result.milliseconds > 0
        assert result.separable, result
    assert len(head.doc_ids) == 210
    for doc_id, q_bar in new_queries.items():  # every new document is top-1 for its own q_bar
        assert head.doc_ids[int(head.scores(q_bar[None]).argmax())] == doc_id
    after = own_rank_ok(head)[:200]
    assert bool((after | ~before).all()), "an old document lost its own representative query"


def test_remove_and_edit():
    head = make_head(50)
    weights = head.weights.clone()
    head.add("x", F.normalize(torch.randn(3, 32), dim=-1), AdditionParams())
    head.remove("x")
    assert head.doc_ids == [f"d{i}" for i in range(50)] and torch.equal(head.weights, weights)
    queries = F.normalize(torch.randn(4, 32), dim=-1)
    head.edit("d7", queries, AdditionParams())
    assert head.doc_ids[-1] == "d7" and len(head.doc_ids) == 50
    assert head.doc_ids[int(head.scores(queries.mean(0, keepdim=True)).argmax())] == "d7"


def test_unseparable_document_is_reported_not_hidden():
    head = make_head(20)
    duplicate = head.rep_queries[3:4].clone()  # the exact query of an existing document
    result = head.add("clone-of-d3", duplicate, AdditionParams(gamma1=5.0, gamma2=5.0, max_steps=5))
    assert not result.separable and result.retried and result.loss > 0


def test_round_trip(tmp_path):
    head = make_head(30)
    head.save(tmp_path / "head")
    loaded = IncDSIHead.load(tmp_path / "head")
    assert loaded.doc_ids == head.doc_ids and torch.equal(loaded.weights, head.weights)


def test_ids_with_line_breaks_and_an_emptied_head_round_trip(tmp_path):
    """Before: ids were saved one per line, so "x\r" came back as "x", an id holding "\u2028" as two
    (the load then refused the head), and a head whose every document was removed as one id ""."""
    head = make_head(3)
    head.doc_ids = ["a", "x\r", "b\u2028c"]
    head.save(tmp_path / "head")
    loaded = IncDSIHead.load(tmp_path / "head")
    assert loaded.doc_ids == ["a", "x\r", "b\u2028c"]
    for doc_id in list(loaded.doc_ids):
        loaded.remove(doc_id)
    loaded.save(tmp_path / "empty")
    emptied = IncDSIHead.load(tmp_path / "empty")
    assert emptied.doc_ids == [] and emptied.weights.shape[0] == 0


def test_document_init_starts_from_the_documents_embedding_and_still_meets_the_constraints():
    """A new document whose embedding already separates keeps its direction (the loss is 0 at the
    start, which beats the best row on q_bar by exactly gamma1)."""
    head = make_head()
    generator = torch.Generator().manual_seed(5)
    document = F.normalize(torch.randn(32, generator=generator), dim=0)
    queries = F.normalize(document + 0.1 * torch.randn(5, 32, generator=generator), dim=-1)
    q_bar = queries.mean(0)
    best = (head.weights @ q_bar).max()
    params = AdditionParams(init="document", gamma1=0.5, gamma2=0.0)
    result = head.add("new", queries, params, document)
    row = head.weights[-1]
    assert result.separable and not result.retried and result.loss == 0
    assert torch.allclose(row, document * (best + 0.5) / document.dot(q_bar), atol=1e-4), "a feasible start is kept"
    base = make_head()
    rival = 6 * F.normalize(q_bar + 0.3 * torch.randn(32, generator=generator), dim=0)
    pushed = IncDSIHead(torch.cat([rival[None], base.weights[1:]]), base.rep_queries, base.doc_ids)  # d0 wins q_bar
    result = pushed.add("new", queries, AdditionParams(init="document", gamma1=1.0), document)
    assert result.separable and pushed.doc_ids[int(pushed.scores(q_bar[None]).argmax())] == "new"
    assert F.cosine_similarity(pushed.weights[-1], document, dim=0) > 0.5, "the row keeps the document's direction"


def test_document_init_needs_the_document():
    with pytest.raises(ValueError, match="needs the embedding"):
        make_head(10).add("x", F.normalize(torch.randn(2, 32), dim=-1), AdditionParams(init="document"))
    with pytest.raises(ValueError, match="unknown IncDSI init"):
        make_head(10).add("x", F.normalize(torch.randn(2, 32), dim=-1), AdditionParams(init="zeros"))


def independent_check(before_w, before_z, result, v, q_bar, p):
    """The result's loss and separability recomputed from the head as it was before the addition."""
    own = (before_w * before_z).sum(1)  # o_j = w_j . z_j, from the rows themselves
    best_other = float((before_w @ q_bar).max())
    want = paper_loss(v.tolist(), q_bar.tolist(), best_other, before_z.tolist(), own.tolist(), p.lambda1, p.gamma1,
                      p.gamma2, 0.0)
    assert result.loss == pytest.approx(want, rel=1e-4, abs=1e-5)
    wins = float(v @ q_bar) > best_other
    keeps = bool(((before_z @ v) < own).all())
    assert result.separable == (wins and keeps)
    return float(v @ q_bar) - best_other, float((before_z @ v - own).max())


def test_margins_after_additions_recomputed_independently():
    """Sequential additions: each result's loss equals the paper's loss over the head it was added
    to (own logits recomputed from the rows, so a wrong stored logit of an earlier addition shows),
    and where the loss is (nearly) 0 both margins hold."""
    head = make_head(150)
    generator = torch.Generator().manual_seed(7)
    met = 0
    for t, p in enumerate([AdditionParams(gamma1=1.0, gamma2=1.0, lambda2=1e-6),
                           AdditionParams(lambda1=0.8, gamma1=2.0, gamma2=0.5, lambda2=1e-4),
                           AdditionParams(lambda1=0.2, gamma1=0.5, gamma2=2.5, lambda2=1e-6, init="document"),
                           AdditionParams(gamma1=3.0, gamma2=3.0, lambda2=1e-6, max_steps=3)] * 2):
        document = F.normalize(torch.randn(32, generator=generator), dim=0)
        queries = F.normalize(document + 0.3 * torch.randn(4, 32, generator=generator), dim=-1)
        before_w, before_z = head.weights.clone(), head.rep_queries.clone()
        result = head.add(f"new{t}", queries, p, document)
        v, q_bar = head.weights[-1], queries.mean(0)
        assert torch.equal(head.rep_queries[-1], q_bar)
        win_margin, worst_slack = independent_check(before_w, before_z, result, v, q_bar, p)
        if result.loss < 1e-6:  # then each hinge is below sqrt(1e-6 / 0.2) = 2.2e-3
            met += 1
            assert win_margin >= p.gamma1 - 3e-3 and worst_slack <= -p.gamma2 + 3e-3
    assert torch.allclose(head.own_logits, (head.weights * head.rep_queries).sum(1), atol=1e-5)
    assert 0 < met < 8  # both cases occurred


def test_a_row_that_steals_an_old_query_is_not_separable():
    """The new document's queries are an old document's representative query: winning q_bar then
    means taking that query from its document, so the optimiser (pushed hard towards l1) wins
    q_bar but must be reported not separable."""
    head = make_head(20)
    before_w, before_z = head.weights.clone(), head.rep_queries.clone()
    p = AdditionParams(lambda1=0.95, gamma1=3.0, gamma2=0.0, max_steps=5)
    result = head.add("clone-of-d3", before_z[3:4].clone(), p)
    v, q_bar = head.weights[-1], before_z[3]
    assert float(v @ q_bar) > float((before_w @ q_bar).max())  # it wins its q_bar...
    assert float(v @ before_z[3]) > float(before_w[3] @ before_z[3])  # ...which steals d3's query
    assert not result.separable and result.retried
    independent_check(before_w, before_z, result, v, q_bar, p)


def test_active_set_grows_and_gives_the_full_problems_rows(monkeypatch):
    """Margins wide enough that rows outside an 8-row active set become violated: the set must
    grow, and the rows (documents added one after another) equal the all-rows problem's."""
    grown = []
    check = IncDSIHead._violated_outside

    def counting(self, rows, points, gamma2, *candidates):
        missing = check(self, rows, points, gamma2, *candidates)
        grown.append(len(missing))
        return missing

    monkeypatch.setattr(IncDSIHead, "_violated_outside", counting)
    generator = torch.Generator().manual_seed(3)
    params = AdditionParams(lambda1=0.5, gamma1=2.0, gamma2=3.0, lambda2=1e-5)
    queries = [F.normalize(torch.randn(4, 32, generator=generator), dim=-1) for _ in range(5)]
    rows = {}
    for active in (8, 10_000):  # 8: the set has to grow; 10_000: every row from the start
        monkeypatch.setattr(IncDSIHead, "ACTIVE_ROWS", active)
        grown.clear()
        head = make_head(600)
        for t, q in enumerate(queries):
            head.add(f"new{t}", q, params)
        rows[active] = head.weights[600:].clone()
        if active == 8:
            assert sum(1 for g in grown if g) >= 5, grown  # the set grew, more than once
    difference = (rows[8] - rows[10_000]).norm(dim=1)
    assert (difference <= 1e-5 * rows[10_000].norm(dim=1)).all(), difference


def test_deepcopy_of_a_head_adds_independently():
    """Trials add to copies (tune_addition): a copy's appends never reach the original's rows."""
    head = make_head(30)
    copied = copy.deepcopy(head)
    copied.add("x", F.normalize(torch.randn(2, 32), dim=-1), AdditionParams())
    assert len(head.doc_ids) == 30 and len(head.weights) == 30 and math.isfinite(float(copied.weights[-1].norm()))


def test_start_rows_are_the_documented_ones():
    """random: the reference code's fresh Linear(d, 1) weight, U(-1/sqrt(d), 1/sqrt(d)) from the seed;
    query: q_bar scaled to beat the best row on q_bar by 1.01 x (best + gamma1); document: the
    document's direction scaled to beat it by exactly gamma1."""
    head = make_head(20, d=16)
    g = torch.Generator().manual_seed(8)
    q_bar, document = torch.randn(16, generator=g), F.normalize(torch.randn(16, generator=g), dim=0)
    best = (head.weights @ q_bar).max()
    p = AdditionParams(gamma1=1.5, seed=5)
    random = head._initial_row("random", q_bar, best, p)
    assert torch.equal(random, head._initial_row("random", q_bar, best, p))
    assert random.abs().max() <= 0.25 and random.abs().max() > 0.2 and random.min() < 0 < random.max()
    assert not torch.equal(random, head._initial_row("random", q_bar, best, AdditionParams(seed=6)))
    assert float(head._initial_row("query", q_bar, best, p) @ q_bar) == pytest.approx(1.01 * (float(best) + 1.5), rel=1e-5)
    aligned = F.normalize(q_bar + 0.5 * document, dim=0)
    start = head._initial_row("document", q_bar, best, p, 3 * aligned)
    assert float(start @ q_bar) == pytest.approx(float(best) + 1.5, rel=1e-5)
    assert F.cosine_similarity(start, aligned, dim=0) == pytest.approx(1.0, abs=1e-6)
    away = F.normalize(document - (document @ q_bar) * q_bar / q_bar.dot(q_bar), dim=0)  # orthogonal to q_bar:
    start = head._initial_row("document", q_bar, best, p, 0.5 * away)  # its alignment counts as 0.1
    assert torch.allclose(start, away * (float(best) + 1.5) / 0.1, rtol=1e-5)
    # a best row below -gamma1 (all rows score negatively): the target score is floored at 1e-3; a short q_bar
    small = 0.5 * q_bar / q_bar.norm()
    assert float(head._initial_row("query", small, torch.tensor(-5.0), p) @ small) == pytest.approx(1.01e-3, rel=1e-4)
    start = head._initial_row("document", small, torch.tensor(-5.0), p, 3 * aligned)
    assert float(start @ small) == pytest.approx(1e-3, rel=1e-4)


def reference_lbfgs(head, start, q_bar, best_other, params, budget):
    """The reference code's optimiser, written here with torch: torch.optim.LBFGS(lr=1,
    tolerance_change=1e-3, line_search_fn='strong_wolfe') on L(v) by autograd over every row,
    outer steps until the constraint loss is 0 or the row moves less than ``tolerance``."""
    z, own = head.rep_queries, head.own_logits

    def constraint(x):
        return (params.lambda1 * torch.relu(best_other + params.gamma1 - x @ q_bar) ** 2
                + (1 - params.lambda1) * torch.relu(z @ x - own + params.gamma2).pow(2).sum())

    def stop(x, previous):
        return float(constraint(x)) == 0.0 or (x - previous).norm() < params.tolerance

    points, steps, _ = torch_lbfgs(lambda x: constraint(x) + params.lambda2 * x.dot(x), start, budget, stop)
    return torch.from_numpy(points[-1]), steps


@pytest.mark.parametrize("seed", range(4))
def test_the_optimiser_takes_the_reference_codes_lbfgs_steps(seed):
    """The addition's optimiser (torch's L-BFGS compiled, over the active set) ends where
    torch.optim.LBFGS on every row, as the reference code runs it, ends: the same row (to 1e-4 of
    its norm: the reference runs in float32, the optimiser in float64) after the same number of
    outer steps."""
    head = make_head(300, seed=seed)
    generator = torch.Generator().manual_seed(10 + seed)
    queries = F.normalize(head.weights[seed] + 2.0 * torch.randn(4, 32, generator=generator), dim=-1)
    q_bar, params = queries.mean(0), AdditionParams(lambda1=0.5, gamma1=1.0, gamma2=1.0, lambda2=1e-5)
    best_other = (head.weights @ q_bar).max()
    start = head._initial_row("random", q_bar, best_other, params)
    row, _, steps, _ = head._optimise(start, q_bar, best_other, params)
    want, want_steps = reference_lbfgs(head, start, q_bar, best_other, params, params.max_steps)
    assert steps == want_steps
    assert (row - want).norm() <= 1e-4 * want.norm()


def test_head_validation_search_and_parameters_from_config():
    with pytest.raises(ValueError, match="^weights, representative queries and doc ids must have one row per document$"):
        IncDSIHead(torch.zeros(3, 4), torch.zeros(2, 4), ["a", "b", "c"])
    with pytest.raises(ValueError, match="one row per document"):
        IncDSIHead(torch.zeros(3, 4), torch.zeros(3, 4), ["a", "b"])
    with pytest.raises(ValueError, match="^duplicate document ids in the head$"):
        IncDSIHead(torch.zeros(2, 4), torch.zeros(2, 4), ["a", "a"])
    with pytest.raises(ValueError, match="^document 'a' is already in the head"):
        IncDSIHead(torch.eye(2), torch.eye(2), ["a", "b"]).add("a", torch.ones(1, 2), AdditionParams())
    head = IncDSIHead(torch.eye(3), torch.eye(3), ["a", "b", "c"])
    assert head.live_ids() == ["a", "b", "c"] and head.live_ids() is not head.doc_ids
    assert head.remove_all(["c", "a"]) == 2 and head.doc_ids == ["b"] and torch.equal(head.weights, torch.eye(3)[1:2])
    head = IncDSIHead(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=torch.float64),
                      torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]), ["a", "b", "c"])
    assert head.weights.dtype == torch.float32 and torch.equal(head.own_logits, torch.tensor([1.0, 2.0, 1.0]))
    scores, ids = head.search(torch.tensor([[1.0, 0.5], [0.0, 1.0]]), k=2)  # scores a 1.0, b 1.0, c 1.5; a 0, b 2, c 1
    assert ids == [["c", "a"], ["b", "c"]] or ids == [["c", "b"], ["b", "c"]]
    assert scores.tolist() == [[1.5, 1.0], [2.0, 1.0]]
    assert head.search(torch.tensor([[1.0, 0.5]]), k=10)[1][0][0] == "c" and len(head.search(torch.ones(1, 2), 10)[1][0]) == 3

    class Config:
        lambda1, gamma2, unrelated = 0.25, 3.0, "x"

    assert AdditionParams.from_values(Config()) == AdditionParams(lambda1=0.25, gamma2=3.0)


def test_one_thread_runs_on_one_thread_and_restores():
    from model_code.methods.incdsi.head import one_thread

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_first_document_of_an_empty_head_and_the_retry_start(monkeypatch):
    empty = IncDSIHead(torch.zeros(0, 8), torch.zeros(0, 8), [])
    result = empty.add("first", F.normalize(torch.randn(3, 8), dim=-1), AdditionParams(gamma1=1.0))
    assert result.separable and empty.doc_ids == ["first"] and result.loss == 0.0  # nothing to beat or protect
    starts = []
    initial = IncDSIHead._initial_row

    def recording(self, init, *args, **kwargs):
        starts.append(init)
        return initial(self, init, *args, **kwargs)

    monkeypatch.setattr(IncDSIHead, "_initial_row", recording)
    head = make_head(20)
    head.add("clone-of-d3", head.rep_queries[3:4].clone(), AdditionParams(gamma1=5.0, gamma2=5.0, max_steps=5))
    assert starts == ["random", "query"]  # not separable from the configured start: retried from scaled q_bar


def test_persistence_and_edits(tmp_path):
    head = make_head(10)
    with pytest.raises(KeyError, match="'nope' is not in the head"):
        head.remove("nope")
    with pytest.raises(FileNotFoundError, match="no weights.npy"):
        IncDSIHead.load(tmp_path / "missing")
    head.save(tmp_path / "a" / "b")  # parents created
    head.save(tmp_path / "a" / "b")  # and overwritten
    assert IncDSIHead.load(tmp_path / "a" / "b").doc_ids == head.doc_ids
    document = F.normalize(torch.randn(32), dim=0)
    queries = F.normalize(document + 0.1 * torch.randn(3, 32), dim=-1)
    result = head.edit("d4", queries, AdditionParams(init="document", gamma1=0.5, gamma2=0.0), document)
    assert result.doc_id == "d4" and head.doc_ids[-1] == "d4"
    assert F.cosine_similarity(head.weights[-1], document, dim=0) > 0.99  # started from the document


@pytest.mark.parametrize(("first", "second", "kept"), [
    ((False, 5.0), (True, 9.0), 2),  # the retry separates: kept whatever its loss
    ((False, 5.0), (False, 3.0), 2),  # neither separates: the lower loss
    ((False, 3.0), (False, 5.0), 1),
    ((False, 3.0), (False, 3.0), 1),  # a tie keeps the first
])
def test_a_failed_start_is_retried_and_the_better_row_kept(monkeypatch, first, second, kept):
    """The configured start, then scaled q_bar: the kept row is the one that separates, else the one
    with the lower loss; steps add up; milliseconds are the call's wall time."""
    import time

    rows = {1: torch.full((32,), 1.0), 2: torch.full((32,), 2.0)}
    scripted = [(rows[1], first[1], 3, first[0]), (rows[2], second[1], 4, second[0])]
    monkeypatch.setattr(IncDSIHead, "_optimise", lambda self, *args: scripted.pop(0))
    head = make_head(20)
    start = time.perf_counter()
    result = head.add("new", F.normalize(torch.randn(2, 32), dim=-1), AdditionParams())
    elapsed = 1000 * (time.perf_counter() - start)
    assert result.retried and result.doc_id == "new" and result.steps == 7 and not scripted
    want = (first, second)[kept - 1]
    assert torch.equal(head.weights[-1], rows[kept]) and (result.separable, result.loss) == want
    assert 0 < result.milliseconds <= elapsed


def test_rows_stay_right_through_appends_and_removals():
    head = make_head(6, d=8)
    expected = dict(zip(head.doc_ids, head.weights.clone()))
    generator = torch.Generator().manual_seed(2)
    for step, action in enumerate(["add", "add", "remove d2", "add", "remove new0", "add", "edit d4"] + ["add"] * 60):
        queries = F.normalize(torch.randn(3, 8, generator=generator), dim=-1)
        if action.startswith("remove"):
            head.remove(action.split()[1])
            del expected[action.split()[1]]
            continue
        doc_id = action.split()[1] if action.startswith("edit") else f"new{step}"
        (head.edit if action.startswith("edit") else head.add)(doc_id, queries, AdditionParams(max_steps=2))
        expected.pop(doc_id, None)
        expected[doc_id] = head.weights[-1].clone()
        assert list(expected) == head.doc_ids
        assert torch.equal(head.weights, torch.stack(list(expected.values())))
        assert torch.allclose(head.own_logits, (head.weights * head.rep_queries).sum(1))


def test_separable_means_winning_q_bar_and_keeping_every_old_query(monkeypatch):
    """The decision on given rows (the optimiser scripted to return them): separable only when the
    row beats every existing row on q_bar and no old representative query scores it at or above its
    own row's logit."""
    head = IncDSIHead(torch.eye(3) * 2, torch.eye(3), ["a", "b", "c"])  # own logits 2
    q_bar = torch.tensor([0.6, 0.8, 0.0])  # best existing row on q_bar: b, 1.6
    cases = [
        (torch.tensor([1.0, 1.4, 0.5]), True),  # wins (1.72) and every slack < 0 (max 1.4 - 2)
        (torch.tensor([0.0, 2.5, 0.0]), False),  # wins (2.0) but b's query scores it 2.5 > 2
        (torch.tensor([1.0, 1.2, 0.0]), False),  # loses q_bar (1.56 < 1.6), steals nothing
        (torch.tensor([0.5, 1.5, 2.6]), False),  # loses q_bar (1.5 < 1.6) and takes c's query
        (torch.tensor([1.2, 1.4, 2.4]), False),  # wins (1.84), c's query 2.4: slack 0.4 in (0, 1)
    ]
    for row, separable in cases:
        monkeypatch.setattr(IncDSIHead, "_lbfgs", lambda self, *a, r=row: (r.clone(), 1, [r.clone()]))
        _, _loss, steps, got = head._optimise(row, q_bar, (head.weights @ q_bar).max(), AdditionParams(gamma1=0.0))
        assert got == separable, row
        assert steps == 1


def test_reported_steps_count_every_lbfgs_step_over_reruns(monkeypatch):
    from model_code.methods.incdsi import head as head_module

    runs = []

    def counting(*args):
        row, steps, points = minimise(*args)
        runs.append(steps)
        return row, steps, points

    minimise = head_module.minimise
    monkeypatch.setattr(head_module, "minimise", counting)
    monkeypatch.setattr(IncDSIHead, "ACTIVE_ROWS", 8)
    head, reruns = make_head(600), 0
    generator = torch.Generator().manual_seed(3)
    for t in range(3):
        runs.clear()
        result = head.add(f"n{t}", F.normalize(torch.randn(4, 32, generator=generator), dim=-1),
                          AdditionParams(gamma1=2.0, gamma2=3.0, lambda2=1e-5))
        assert result.steps == sum(runs)
        reruns += len(runs) - 1
    assert reruns >= 2  # the active set grew, and the steps of every run were counted


def test_rows_outside_the_set_violated_at_any_evaluated_point():
    """Row j outside the set joins when z_j . p - o_j + gamma2 > -1e-4 at some point p (the allowance
    catches rounding at the margin); rows in the set are never returned."""
    z = torch.eye(6, 2)  # rows 0, 1 score the points' coordinates; rows 2-5 score 0
    z[2:, 0] = torch.tensor([1.0, 1.0, 1.0, 1.0])
    weights = torch.zeros(6, 2)
    head = IncDSIHead(weights, z, [f"d{i}" for i in range(6)])
    head.own_logits = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    points = torch.tensor([[0.0, -0.5], [0.5, -2.0]])  # row 1 (own -1): -0.5 + 1 + 0.2 > 0 at the first point
    # gamma2 = 0.2: row 0 at p2: 0.5 - 1 + 0.2 < 0 (out); rows 2-5 score p[0]: 0 or 0.5, own 0 -> in,
    # unless in the set
    rows = torch.tensor([2, 3])
    assert head._violated_outside(rows, points, 0.2).tolist() == [1, 4, 5]
    head.own_logits = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5 + 0.2 + 5e-5, 0.5 + 0.2 - 5e-5])  # rows 4, 5 at the margin
    points = torch.tensor([[0.5, -1.0]])
    assert head._violated_outside(rows, points, 0.2).tolist() == [0, 4, 5]  # 4 (-5e-5, the allowance) and 5 (+5e-5)
    head.own_logits[4] = 0.5 + 0.2 + 1e-3
    assert head._violated_outside(rows, points, 0.2).tolist() == [0, 5]
    assert head._violated_outside(torch.arange(6), points, 0.2).tolist() == []


def test_no_steps_keeps_a_start():
    """max_steps 0: no optimisation; the row is one of the two starts, unmoved, and 0 steps are reported."""
    head = make_head(20)
    queries = F.normalize(torch.randn(2, 32), dim=-1)
    q_bar, p = queries.mean(0), AdditionParams(init="random", max_steps=0, seed=4)
    best = (head.weights @ q_bar).max()
    starts = [head._initial_row("random", q_bar, best, p), head._initial_row("query", q_bar, best, p)]
    result = head.add("x", queries, p)
    assert result.steps == 0 and any(torch.equal(head.weights[-1], s) for s in starts)


def test_a_delta_names_its_base_by_the_sha256_of_its_ids_and_writes_where_asked(tmp_path):
    """The base a delta was made from is recorded as sha256 of its row ids joined by newlines (by
    hand here: deltas stored by one version are read by the next); save_delta creates missing
    parent folders and writes into a folder that exists already."""
    import hashlib
    import json

    from model_code.methods.incdsi.head import ids_digest

    assert ids_digest(["d0", "d1", "n7"]) == hashlib.sha256(b"d0\nd1\nn7").hexdigest()
    g = torch.Generator().manual_seed(4)
    head = IncDSIHead(torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g), ["d0", "d1", "n7"])
    head.save(tmp_path / "base")
    loaded = IncDSIHead.load(tmp_path / "base")
    loaded.remove("d1")
    loaded.save_delta(tmp_path / "missing" / "parent" / "delta")
    delta = json.loads((tmp_path / "missing" / "parent" / "delta" / "delta.json").read_text())
    assert delta == {"ids_before": hashlib.sha256(b"d0\nd1\nn7").hexdigest(), "dropped": ["d1"], "doc_ids": []}
    (tmp_path / "existing").mkdir()
    loaded.save_delta(tmp_path / "existing")
    replayed = IncDSIHead.load(tmp_path / "base").apply_delta(tmp_path / "existing")
    assert replayed.doc_ids == ["d0", "n7"] and torch.equal(replayed.weights, head.weights[[0, 2]])


def test_a_head_delta_gives_the_head_a_whole_copy_gives(tmp_path):
    rng = torch.Generator().manual_seed(0)
    head = IncDSIHead(torch.randn(6, 8, generator=rng), torch.randn(6, 8, generator=rng), [f"d{i}" for i in range(6)])
    head.save(tmp_path / "base")
    writer = IncDSIHead.load(tmp_path / "base")
    params = AdditionParams(max_steps=5)
    writer.add("n0", torch.randn(3, 8, generator=rng), params)
    writer.remove("d2")  # a loaded row
    writer.add("n1", torch.randn(3, 8, generator=rng), params)
    writer.edit("d4", torch.randn(3, 8, generator=rng), params)  # loaded row, deleted then appended
    writer.remove("n0")  # added and removed within the update
    writer.save(tmp_path / "whole")
    writer.save_delta(tmp_path / "delta")

    replayed = IncDSIHead.load(tmp_path / "base").apply_delta(tmp_path / "delta")
    whole = IncDSIHead.load(tmp_path / "whole")
    assert replayed.doc_ids == whole.doc_ids == ["d0", "d1", "d3", "d5", "n1", "d4"]
    for name in ("weights", "rep_queries", "own_logits"):
        assert torch.equal(getattr(replayed, name), getattr(whole, name)), name
    delta = json.loads((tmp_path / "delta" / "delta.json").read_text())
    assert (sorted(delta["dropped"]), delta["doc_ids"]) == (["d2", "d4"], ["n1", "d4"])
    with pytest.raises(ValueError, match="made from another version"):
        replayed.apply_delta(tmp_path / "delta")


def clustered_head(n: int, d: int = 32, clusters: int = 20, seed: int = 0) -> IncDSIHead:
    """Rows around a few directions (as embeddings gather), representative queries near them."""
    generator = torch.Generator().manual_seed(seed)
    centers = F.normalize(torch.randn(clusters, d, generator=generator), dim=-1)
    rows = F.normalize(centers[torch.randint(clusters, (n,), generator=generator)]
                       + 0.15 * torch.randn(n, d, generator=generator), dim=-1) * 5
    queries = F.normalize(rows + 0.3 * torch.randn(n, d, generator=generator), dim=-1)
    return IncDSIHead(rows, queries, [f"d{i}" for i in range(n)])


def new_documents(head: IncDSIHead, count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(queries, document) pairs near existing rows, where the constraints bite."""
    generator = torch.Generator().manual_seed(seed)
    picked = torch.randint(len(head.doc_ids), (count,), generator=generator)
    documents = F.normalize(head.weights[picked] + 1.0 * torch.randn(count, head.weights.shape[1], generator=generator),
                            dim=-1)
    return [(F.normalize(document + 0.3 * torch.randn(4, len(document), generator=generator), dim=-1), document)
            for document in documents]


WIDE = {"lambda1": 0.5, "gamma1": 2.0, "gamma2": 3.0, "lambda2": 1e-5}  # margins that reach many rows


@pytest.mark.parametrize("init", ["random", "document"])
def test_with_every_row_a_candidate_the_pruned_addition_is_the_exact_one(monkeypatch, init):
    """constraint_candidates >= n: nothing to prune, so the rows (added one after another, an 8-row
    active set growing) are the exact problem's, bitwise."""
    monkeypatch.setattr(IncDSIHead, "ACTIVE_ROWS", 8)
    documents = new_documents(clustered_head(400), 6, seed=1)
    rows = {}
    for candidates in (None, 10_000):
        head = clustered_head(400)
        for t, (queries, document) in enumerate(documents):
            head.add(f"new{t}", queries, AdditionParams(**WIDE, init=init, constraint_candidates=candidates), document)
        rows[candidates] = head.weights[400:].clone()
    assert torch.equal(rows[10_000], rows[None])


@pytest.mark.parametrize("init", ["random", "document"])
def test_a_pruned_addition_is_the_exact_addition_to_the_candidate_rows(init):
    """With C = 12 of 2,000 rows: the row, loss, steps and separability are those of an exact
    addition to a head made of the candidate rows only (the best other row, the rows violated at
    the start, the active set and the outside check all over the candidates), so the constraints
    without margins hold over them when it reports separable; and the exact addition to the whole
    head differs for some documents (rows outside the candidates would have been violated), so
    pruning took place."""
    head = clustered_head(2000)
    params = AdditionParams(**WIDE, init=init, constraint_candidates=12)
    differs = 0
    for t, (queries, document) in enumerate(new_documents(head, 8, seed=2)):
        q_bar = queries.mean(0)
        candidates = head._candidates(q_bar, 12)
        assert 12 <= len(candidates) <= 24 and torch.equal(candidates, candidates.unique())
        sub = IncDSIHead(head.weights[candidates], head.rep_queries[candidates], [f"c{i}" for i in candidates.tolist()])
        whole = copy.deepcopy(head)
        whole._search = None
        expected = sub.add("new", queries, replace(params, constraint_candidates=None), document)
        exact = whole.add("new", queries, replace(params, constraint_candidates=None), document)
        result = head.add(f"new{t}", queries, params, document)
        v = head.weights[-1]
        assert (v - sub.weights[-1]).norm() <= 1e-5 * v.norm()
        assert (result.separable, result.steps) == (expected.separable, expected.steps)
        assert result.loss == pytest.approx(expected.loss, rel=1e-4, abs=1e-6)
        if result.separable:
            z, own = head.rep_queries[candidates], head.own_logits[candidates]
            assert float(v @ q_bar) > float((head.weights[candidates] @ q_bar).max()) and bool((z @ v < own).all())
        differs += bool((v - whole.weights[-1]).norm() > 1e-4 * v.norm()) or exact.separable != result.separable
    assert differs >= 2


def test_the_candidates_are_c_rows_near_q_bar_and_the_best_scoring_row():
    """C representative queries nearest q_bar (most of the exact top C) and C rows scoring highest
    on q_bar, whatever their query: a row planted to win q_bar with a query far from it is found
    (so best_other is its score), and the set grows with C."""
    head = clustered_head(3000)
    generator = torch.Generator().manual_seed(3)
    q_bar = F.normalize(head.rep_queries[17] + 0.1 * torch.randn(32, generator=generator), dim=0)
    head.weights[2500] = 8 * q_bar  # the best row on q_bar...
    head.rep_queries[2500] = -q_bar  # ...whose own query is the farthest from it
    head.own_logits = (head.weights * head.rep_queries).sum(1)
    sizes = []
    for count in (16, 64):
        candidates = set(head._candidates(q_bar, count).tolist())
        nearest = set((head.rep_queries @ q_bar).topk(count).indices.tolist())
        assert len(nearest & candidates) >= 0.9 * count and 2500 in candidates and len(candidates) <= 2 * count
        sizes.append(len(candidates))
    assert sizes[0] < sizes[1]
    head.add("new", q_bar[None], AdditionParams(gamma1=1.0, constraint_candidates=16))
    assert float(head.weights[-1] @ q_bar) > 8 * float(q_bar @ q_bar)  # beat the planted row


def test_the_candidate_search_follows_appends_removals_and_copies():
    """Rows appended after the search was built are found; after a removal the later rows' positions
    shift and the search still names the right rows (it is not rebuilt); a copy's appends stay in
    the copy."""
    head = clustered_head(1000)
    params = AdditionParams(constraint_candidates=8)
    documents = new_documents(head, 3, seed=4)
    head.add("new0", documents[0][0], params)
    search = head._search
    assert search is not None and len(search[0]) == len(search[1]) == 1001
    q_bar = documents[0][0].mean(0)
    before = head._candidates(q_bar, 8).tolist()
    assert 1000 in before and 5 not in before and 999 not in before  # new0's row wins its q_bar
    head.remove("d5")
    head.remove("d999")
    found = head._candidates(q_bar, 8).tolist()
    assert head._search is search and len(search[0]) == len(search[1]) == 999
    assert head.doc_ids[998] == "new0" and {p - (p > 5) - (p > 999) for p in before} == set(found)  # shifted
    copied = copy.deepcopy(head)
    copied.add("new1", documents[1][0], params)
    assert len(copied._search[0]) == 1000 and len(head._search[0]) == 999
    head.add("new2", documents[2][0], params)
    assert head._candidates(documents[2][0].mean(0), 8).max() == 999  # new2 wins its own q_bar


def test_constraint_candidates_comes_from_the_settings_and_old_addition_files_read_as_exact():
    from model_code.methods.incdsi.settings import IncDSIParams

    assert AdditionParams.from_values(IncDSIParams(constraint_candidates=256)).constraint_candidates == 256
    assert IncDSIParams().constraint_candidates is None
    old_file = {"lambda1": 0.4, "gamma1": 1.0, "gamma2": 2.0, "lambda2": 1e-6, "init": "random", "max_steps": 30,
                "tolerance": 1e-3, "seed": 123}  # an addition.json written before the setting existed
    assert AdditionParams(**old_file).constraint_candidates is None
    with pytest.raises(ValueError):
        IncDSIParams(constraint_candidates=0)
