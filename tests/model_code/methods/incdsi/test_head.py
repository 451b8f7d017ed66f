"""IncDSI additions: the new document wins its queries, old documents keep theirs, remove/edit."""

import pytest
import torch
import torch.nn.functional as F

from model_code.methods.incdsi.head import AdditionParams, IncDSIHead


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
