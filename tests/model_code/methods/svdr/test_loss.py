"""SVDR's semi-parametric loss (``model_code/methods/svdr/loss.py``) against hand-written examples: each
term ℓ(A, B) in NumPy, their mean, the gradient against the terms written out with torch primitives,
and the loss with hard negatives, known positives and one rank's rows."""

import numpy as np
import pytest
import torch

from model_code.methods.svdr.loss import svdr_loss, symmetric_nll
from tests.helpers.svdr import ell

Q = [[3.0, 1.0, 0.5, 2.0], [0.2, 4.0, 1.0, 0.1]]
P = [[2.5, 0.3, 1.0, 0.2], [0.1, 3.0, 0.2, 1.5]]
BIN_Q = [[1.0, 0, 0, 1.0], [0, 1.0, 0, 0]]
BIN_P = [[1.0, 0, 1.0, 0], [0, 0, 0, 1.0]]
Q_K = [[3.0, 0, 0, 2.0], [0, 4.0, 0, 0]]  # top-1 of each row, or a token of the query
P_K = [[2.5, 0, 1.0, 0], [0, 3.0, 0, 1.5]]


def as_tensor(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)  # a confident row's loss is ~1e-5: beyond float32's digits


def test_symmetric_nll_by_hand():
    eye = torch.eye(2)
    # each direction: -log(e / (e + 1)) = log(1 + 1/e) for both rows
    assert symmetric_nll(eye, eye, slice(0, 2)).item() == pytest.approx(np.log(1 + np.exp(-1)), rel=1e-6)


def test_each_term_of_the_semi_parametric_loss():
    q, p, bin_q, bin_p = map(as_tensor, (Q, P, BIN_Q, BIN_P))
    loss, parts = svdr_loss(q, p, bin_q, bin_p, topk=1)
    q_, p_, bin_q_, bin_p_, q_k, p_k = map(np.array, (Q, P, BIN_Q, BIN_P, Q_K, P_K))
    expected = {"q_k.p": ell(q_k, p_), "q.p_k": ell(q_, p_k), "bin_q.p": ell(bin_q_, p_), "q.bin_p": ell(q_, bin_p_)}
    assert parts == pytest.approx(expected, rel=1e-5)
    assert loss.item() == pytest.approx(sum(expected.values()) / 4, rel=1e-5)
    vdr, vdr_parts = svdr_loss(q, p, bin_q, bin_p, topk=1, variant="vdr")
    assert set(vdr_parts) == {"q_k.p", "bin_q.p"}
    assert vdr.item() == pytest.approx((expected["q_k.p"] + expected["bin_q.p"]) / 2, rel=1e-5)


def test_the_loss_gradient_reaches_q_and_p_through_every_term():
    """Autograd of the loss against autograd of the four terms written out here with torch
    primitives, the top-k ∪ lexical masks fixed as constants (Q_K, P_K): a term whose sparsified
    side carries no gradient (detached, built under no_grad) changes q's or p's gradient."""
    q, p = as_tensor(Q).requires_grad_(), as_tensor(P).requires_grad_()
    svdr_loss(q, p, as_tensor(BIN_Q), as_tensor(BIN_P), topk=1)[0].backward()

    def ell_torch(a, b):
        forward, backward = a @ b.T, b @ a.T
        return 0.5 * sum((scores.logsumexp(1) - scores.diagonal()).mean() for scores in (forward, backward))

    q_ref, p_ref = as_tensor(Q).requires_grad_(), as_tensor(P).requires_grad_()
    keep_q, keep_p = as_tensor(Q_K) != 0, as_tensor(P_K) != 0
    reference = (ell_torch(q_ref * keep_q, p_ref) + ell_torch(q_ref, p_ref * keep_p)
                 + ell_torch(as_tensor(BIN_Q), p_ref) + ell_torch(q_ref, as_tensor(BIN_P))) / 4
    reference.backward()
    torch.testing.assert_close(q.grad, q_ref.grad)
    torch.testing.assert_close(p.grad, p_ref.grad)
    assert (q.grad[~keep_q] != 0).all()  # dropped dimensions still learn through the other terms


def test_the_loss_with_hard_negatives_known_positives_and_one_ranks_rows():
    negative = [[0.5, 0.5, 2.0, 1.0]]
    q, p, bin_q, bin_p = map(as_tensor, (Q, P + negative, BIN_Q, BIN_P + [[0, 0, 1.0, 1.0]]))
    p_k = np.array(P_K + [[0, 0, 2.0, 1.0]])  # the negative's top-1 is dim 2, its tokens dims 2 and 3
    # passage 1 is also relevant to query 0; the negative is relevant to query 1
    excluded = torch.tensor([[False, True, False], [False, False, True]])
    for rows in (slice(1, 2), slice(0, 2)):  # one rank's row of the global batch, and all of it
        _, parts = svdr_loss(q, p, bin_q, bin_p, topk=1, rows=rows, excluded=excluded)
        expected = ell(np.array(Q), p_k, rows=rows, excluded=excluded.numpy())
        assert parts["q.p_k"] == pytest.approx(expected, rel=1e-5)
    _, parts = svdr_loss(q, p, bin_q, bin_p, topk=1)  # nothing excluded: the negative counts for both queries
    assert parts["q.p_k"] == pytest.approx(ell(np.array(Q), p_k), rel=1e-5)
