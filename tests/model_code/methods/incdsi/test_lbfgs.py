"""IncDSI's compiled optimiser (``model_code/methods/incdsi/lbfgs.py``) against independent
computations: the loss term by term in Python loops and its gradient by autograd and finite
differences; every point it evaluates against the points torch.optim.LBFGS itself evaluates on
the same loss by autograd, from the same start, in float64, with the reference code's outer loop
(the history carried between steps, the line search's bracketing and zoom, both stopping rules)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from model_code.methods.incdsi.lbfgs import (
    HISTORY_SIZE,
    MAX_ITER,
    _cubic_interpolate,
    constraint_loss,
    loss_and_gradient,
    minimise,
)
from tests.helpers.incdsi import paper_loss, torch_lbfgs


@pytest.fixture
def point():
    """A point where l1 is active and l2 has both violated and satisfied rows (float64)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(12, 6, generator=g, dtype=torch.float64)
    own = torch.randn(12, generator=g, dtype=torch.float64)
    q_bar = torch.randn(6, generator=g, dtype=torch.float64)
    v = torch.randn(6, generator=g, dtype=torch.float64)
    lambda1, gamma1, gamma2, lambda2 = 0.3, 1.5, 1.5, 0.2
    best_other = float(v @ q_bar) + 0.8  # l1 active
    slack = z @ v - own + gamma2
    assert (slack > 1).sum() >= 3 and (slack < 0).sum() >= 3 and ((slack > 0) & (slack < 1)).any()
    return v, q_bar, z, own, (best_other, lambda1, gamma1, gamma2, lambda2)


def test_loss_is_the_papers(point):
    v, q_bar, z, own, coefficients = point
    loss, _ = loss_and_gradient(v.numpy(), q_bar.numpy(), np.array(coefficients), z.numpy(), own.numpy())
    want = paper_loss(v.tolist(), q_bar.tolist(), coefficients[0], z.tolist(), own.tolist(), *coefficients[1:])
    assert loss == pytest.approx(want, rel=1e-12)
    constraint = constraint_loss(v.numpy(), q_bar.numpy(), np.array(coefficients), z.numpy(), own.numpy())
    assert constraint == pytest.approx(want - coefficients[4] * float(v @ v), rel=1e-12)


def test_gradient_matches_autograd_and_finite_differences(point):
    v, q_bar, z, own, (best_other, lambda1, gamma1, gamma2, lambda2) = point
    _, gradient = loss_and_gradient(v.numpy(), q_bar.numpy(), np.array([best_other, lambda1, gamma1, gamma2, lambda2]),
                                    z.numpy(), own.numpy())
    x = v.clone().requires_grad_(True)
    reference = (lambda1 * torch.relu(best_other + gamma1 - x @ q_bar) ** 2
                 + (1 - lambda1) * torch.relu(z @ x - own + gamma2).pow(2).sum() + lambda2 * x.dot(x))
    reference.backward()
    np.testing.assert_allclose(gradient, x.grad.numpy(), rtol=1e-12, atol=1e-12)

    eps, args = 1e-6, (q_bar.tolist(), best_other, z.tolist(), own.tolist(), lambda1, gamma1, gamma2, lambda2)
    central = []
    for i in range(len(v)):
        up, down = v.tolist(), v.tolist()
        up[i] += eps
        down[i] -= eps
        central.append((paper_loss(up, *args) - paper_loss(down, *args)) / (2 * eps))
    np.testing.assert_allclose(gradient, central, rtol=1e-6, atol=1e-7)


def problem(seed, rows=60, dim=32, spread=0.5, start_scale=1.0, lambda1=0.5, gamma1=1.0, gamma2=1.0, lambda2=1e-5):
    """An addition: ``rows`` documents (rows of norm about 5, each with its representative query),
    a new document's q_bar near one of them, and a start drawn as the reference code draws it."""
    g = torch.Generator().manual_seed(seed)
    z = torch.nn.functional.normalize(torch.randn(rows, dim, generator=g, dtype=torch.float64), dim=1)
    weights = 5 * torch.nn.functional.normalize(z + 0.3 * torch.randn(rows, dim, generator=g, dtype=torch.float64),
                                                dim=1)
    own = (weights * z).sum(1)
    q_bar = torch.nn.functional.normalize(z[0] + spread * torch.randn(dim, generator=g, dtype=torch.float64), dim=0)
    start = start_scale * (torch.rand(dim, generator=g, dtype=torch.float64) * 2 - 1) / dim**0.5
    return start, q_bar, z, own, (float((weights @ q_bar).max()), lambda1, gamma1, gamma2, lambda2)


MOVED, MET, BUDGET = "moved less than the tolerance", "margins met", "budget"


def torch_run(start, q_bar, z, own, coefficients, budget, tolerance, max_iter, history_size):
    """torch.optim.LBFGS on L(v) by autograd, with the reference code's outer loop: every point
    evaluated (and each step's final row), the steps, and why it stopped."""
    best_other, lambda1, gamma1, gamma2, lambda2 = coefficients

    def constraint(x):
        return lambda1 * torch.relu(best_other + gamma1 - x @ q_bar) ** 2 + (1 - lambda1) * torch.relu(
            z @ x - own + gamma2).pow(2).sum()

    def stop(x, previous):
        if float(constraint(x)) == 0.0:
            return MET
        return MOVED if (x - previous).norm() < tolerance else None

    return torch_lbfgs(lambda x: constraint(x) + lambda2 * x.dot(x), start, budget, stop, max_iter=max_iter,
                       history_size=history_size)


@pytest.mark.parametrize(("case", "settings", "budget", "why"), [
    (problem(0), {}, 30, MOVED),  # the reference's settings and a random start
    (problem(3, rows=10, spread=5.0, lambda2=0.0), {}, 30, MET),  # a q_bar far from every row: met in one step
    (problem(3, rows=10, spread=5.0, lambda2=1e-5), {}, 30, MET),  # ...with the regulariser: L > 0, the margins met
    (problem(1, spread=1.5, gamma1=3.0, gamma2=3.0), {}, 30, MOVED),  # wide margins: many rows in play
    (problem(2, spread=1.5, gamma1=3.0, gamma2=3.0), {"max_iter": 7, "history_size": 3}, 30, MOVED),  # history shifts
    (problem(3, spread=1.5, gamma1=3.0, gamma2=3.0), {"max_iter": 2}, 3, BUDGET),
    (problem(4, start_scale=1e-3, lambda1=0.9, gamma1=0.05, gamma2=0.05), {}, 30, MOVED),  # a start far too short
    (problem(5, rows=300, dim=48, spread=2.0, gamma1=4.0, gamma2=4.0, lambda2=1e-3), {}, 30, MOVED),
])
def test_the_same_points_as_torch(case, settings, budget, why):
    max_iter, history_size = settings.get("max_iter", MAX_ITER), settings.get("history_size", HISTORY_SIZE)
    start, q_bar, z, own, coefficients = case
    want, want_steps, want_why = torch_run(start, q_bar, z, own, coefficients, budget, 1e-3, max_iter, history_size)
    row, steps, got = minimise(start.numpy().copy(), q_bar.numpy(), np.array(coefficients), z.numpy(), own.numpy(),
                               budget, 1e-3, max_iter, history_size)
    assert want_why == why
    assert steps == want_steps and len(got) == len(want) >= 3
    np.testing.assert_allclose(got, np.array(want), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(row, got[-1])


def test_a_start_that_meets_every_margin_stays():
    """With no regulariser and every margin met the gradient is 0: one evaluation, no move, one step."""
    start, q_bar, z, own, coefficients = problem(0, lambda2=0.0)
    coefficients = (-100.0, *coefficients[1:])
    start = np.zeros_like(start.numpy())  # scores 0 on every query: l1 is 0 with best_other -100,
    own = own + 10.0  # and each l2 term with own logits above gamma2
    row, steps, points = minimise(start, q_bar.numpy(), np.array(coefficients), z.numpy(), own.numpy(), 30, 1e-3,
                                  MAX_ITER, HISTORY_SIZE)
    assert constraint_loss(start, q_bar.numpy(), np.array(coefficients), z.numpy(), own.numpy()) == 0.0
    assert steps == 1 and len(points) == 3 and not row.any()


def test_no_budget_evaluates_nothing():
    start, q_bar, z, own, coefficients = problem(0)
    row, steps, points = minimise(start.numpy().copy(), q_bar.numpy(), np.array(coefficients), z.numpy(), own.numpy(),
                                  0, 1e-3, MAX_ITER, HISTORY_SIZE)
    assert steps == 0 and len(points) == 1 and np.array_equal(row, start.numpy())


@pytest.mark.parametrize(("x1", "f1", "g1", "x2", "f2", "g2", "bounds"), [
    (0.0, 1.0, -1.0, 1.0, 0.5, 0.3, None),  # the cubic's minimiser inside the interval
    (0.0, 1.0, -1.0, 1.0, 0.0, -1.0, (1.01, 10.0)),  # denominator 0: -2 / 0 = -inf, so the upper bound
    (2.0, 0.0, -1.0, 1.0, 1.0, -1.0, None),  # the same with x1 > x2
    (0.0, 1.0, -1.0, 1.0, 0.9, -1.0, (1.01, 10.0)),  # no real minimiser (d2^2 < 0): the bounds' midpoint
])
def test_cubic_interpolation_as_torchs(x1, f1, g1, x2, f2, g2, bounds):
    """Torch's _cubic_interpolate with its directional derivatives as tensors, as its line search
    passes them: a zero denominator gives inf or nan there, not an error."""
    from torch.optim.lbfgs import _cubic_interpolate as torchs

    want = float(torchs(x1, f1, torch.tensor(g1, dtype=torch.float64), x2, f2, torch.tensor(g2, dtype=torch.float64),
                        bounds=bounds))
    lower, upper = bounds if bounds is not None else (min(x1, x2), max(x1, x2))
    assert _cubic_interpolate(x1, f1, g1, x2, f2, g2, lower, upper) == pytest.approx(want, rel=1e-12)


def test_torchs_algorithm_on_other_objectives():
    """The zoom phase's paths that IncDSI's loss never reaches, on other objectives, as plain
    Python in a process of its own (``lbfgs_other_objectives.py``)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         str(Path(__file__).with_name("lbfgs_other_objectives.py"))],
        env={**os.environ, "NUMBA_DISABLE_JIT": "1"}, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0 and "6 passed" in done.stdout, done.stdout + done.stderr


def test_mismatched_shapes_are_refused_not_read_past():
    start, q_bar, z, own, coefficients = problem(0)
    with pytest.raises(ValueError, match="one length"):
        minimise(start.numpy().copy(), q_bar.numpy()[:-1], np.array(coefficients), z.numpy(), own.numpy(), 30, 1e-3,
                 MAX_ITER, HISTORY_SIZE)
    with pytest.raises(ValueError, match="one length"):
        minimise(start.numpy().copy(), q_bar.numpy(), np.array(coefficients), z.numpy(), own.numpy()[:-1], 30, 1e-3,
                 MAX_ITER, HISTORY_SIZE)
