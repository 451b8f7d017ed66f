"""The numpy L-BFGS (``model_code/methods/incdsi/lbfgs.py``) against torch.optim.LBFGS itself: on
the same objective, from the same start, in float64, both evaluate the objective at the same
points, step after step (the history carried between steps, the line search's bracketing and
zoom, the stopping rules)."""

import numpy as np
import pytest
import torch

from model_code.methods.incdsi.lbfgs import LBFGS, _cubic_interpolate


def rosenbrock(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def hinge(x):
    """An IncDSI-like loss: squared hinges over random rows, one pulling term, a small ridge."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(40, len(x), generator=g, dtype=torch.float64)
    q = torch.randn(len(x), generator=g, dtype=torch.float64)
    return (torch.relu(z @ x - 1.0).pow(2).sum() + 0.5 * torch.relu(3.0 - x @ q) ** 2 + 1e-3 * x.dot(x))


def torch_points(objective, start, steps, **settings):
    """Every point torch.optim.LBFGS evaluates ``objective`` at, over ``steps`` calls of step()."""
    x = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([x], lr=1, line_search_fn="strong_wolfe", **settings)
    points = []

    def closure():
        optimizer.zero_grad()
        points.append(x.detach().clone().numpy())
        loss = objective(x)
        loss.backward()
        return loss

    for _ in range(steps):
        optimizer.step(closure)
    return points, x.detach().numpy()


def numpy_points(objective, start, steps, **settings):
    points = []

    def evaluate(x):
        points.append(x)
        t = torch.tensor(x, requires_grad=True)
        loss = objective(t)
        loss.backward()
        return float(loss.detach()), t.grad.numpy()

    optimizer = LBFGS(evaluate, np.array(start, dtype=np.float64), **settings)
    for _ in range(steps):
        optimizer.step()
    return points, optimizer.x


@pytest.mark.parametrize(("objective", "start", "steps", "settings"), [
    (rosenbrock, [-1.2, 1.0, -0.5, 0.8], 3, {"tolerance_change": 1e-9}),  # 20 iterations a step, long line searches
    (rosenbrock, [-1.2, 1.0, -0.5, 0.8], 4, {"tolerance_change": 1e-9, "history_size": 3, "max_iter": 7}),  # history shifts
    (hinge, list(np.linspace(-1, 1, 12)), 5, {"tolerance_change": 1e-3}),  # IncDSI's settings: stops on small changes
    (lambda x: 1e-3 * (x - 100).pow(2).sum(), [0.0, 0.0], 2, {"tolerance_change": 1e-9}),  # first step too short: extrapolates
    (lambda x: (x.abs() ** 1.2).sum() + (x[0] - 2 * x[1]).abs() ** 1.5, [3.0, -2.0, 1.0], 4,
     {"tolerance_change": 1e-12}),  # kinks: the zoom's interpolations land near the bracket's ends
    (lambda x: (x**4 - x**2 + x).sum(), [-0.113, 3.116, 3.472, -1.138], 4, {"tolerance_change": 1e-12}),  # ...and move inwards
])
def test_the_same_points_as_torch(objective, start, steps, settings):
    want, want_end = torch_points(objective, start, steps, **settings)
    got, got_end = numpy_points(objective, start, steps, **settings)
    assert len(want) >= 3 * steps and len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got_end, want_end, rtol=1e-9, atol=1e-12)


def test_a_stationary_start_takes_no_step():
    """A gradient below tolerance_grad (1e-7) at the start: one evaluation, the point unchanged."""
    calls = []

    def flat(x):
        calls.append(x)
        return 0.0, np.zeros_like(x)

    optimizer = LBFGS(flat, np.ones(3), tolerance_change=1e-3)
    optimizer.step()
    assert len(calls) == 1 and np.array_equal(optimizer.x, np.ones(3))


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
    got = _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=bounds)
    assert got == pytest.approx(want, rel=1e-12)
