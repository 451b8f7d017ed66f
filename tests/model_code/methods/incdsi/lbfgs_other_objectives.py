"""The optimiser's algorithm on objectives other than IncDSI's loss, against torch.optim.LBFGS.

IncDSI's loss is convex and piecewise quadratic: its line searches never reach parts of the zoom
phase (a bracket shrunk below the tolerance, a trial step moved inwards from the bracket's ends),
whatever the problem (test_lbfgs.py covers every other path, compiled). Here the same source runs
as plain Python (``NUMBA_DISABLE_JIT=1``, so its evaluation can be swapped for any objective by
autograd) on Rosenbrock's function and on functions with kinks, which do. Not collected by itself:
``test_lbfgs.py::test_torchs_algorithm_on_other_objectives`` runs it in a process of its own.
"""

import os

import numpy as np
import pytest
import torch

from model_code.methods.incdsi import lbfgs
from tests.helpers.incdsi import torch_lbfgs

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") != "1", reason="needs NUMBA_DISABLE_JIT=1")


def rosenbrock(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def our_points(monkeypatch, objective, start, steps, tolerance_change, max_iter, history_size):
    def evaluate(x, q_bar, coefficients, z, own, points, counter):
        points[counter[0]] = x
        counter[0] += 1
        t = torch.tensor(x, requires_grad=True)
        loss = objective(t)
        loss.backward()
        return float(loss.detach()), t.grad.numpy()

    monkeypatch.setattr(lbfgs, "_evaluate", evaluate)
    monkeypatch.setattr(lbfgs, "TOLERANCE_CHANGE", tolerance_change)
    monkeypatch.setattr(lbfgs, "constraint_loss", lambda *args: 1.0)  # never met: every step is taken
    size = len(start)  # the loss's arrays go unread (evaluate ignores them), shaped as minimise checks them
    _, taken, points = lbfgs.minimise(np.array(start, dtype=np.float64), np.zeros(size), np.zeros(5),
                                      np.zeros((0, size)), np.zeros(0), steps, -1.0, max_iter, history_size)
    assert taken == steps
    return points


@pytest.mark.parametrize(("objective", "start", "steps", "settings"), [
    (rosenbrock, [-1.2, 1.0, -0.5, 0.8], 3, {"tolerance_change": 1e-9}),  # 20 iterations a step, long line searches
    (rosenbrock, [-1.2, 1.0, -0.5, 0.8], 4, {"tolerance_change": 1e-9, "history_size": 3, "max_iter": 7}),
    (lambda x: 1e-3 * (x - 100).pow(2).sum(), [0.0, 0.0], 2, {"tolerance_change": 1e-9}),  # first step too short
    (lambda x: (x.abs() ** 1.2).sum() + (x[0] - 2 * x[1]).abs() ** 1.5, [3.0, -2.0, 1.0], 4,
     {"tolerance_change": 1e-12}),  # kinks: the zoom's interpolations land near the bracket's ends
    (lambda x: (x**4 - x**2 + x).sum(), [-0.113, 3.116, 3.472, -1.138], 4, {"tolerance_change": 1e-12}),
    # a trial at the bracket's end after one without progress: moved inwards (found by a seeded search;
    # |x|^1.1 is steep near 0, so a start rounded to fewer digits takes another path)
    (lambda x: (x.abs() ** 1.1).sum(), [2.9054313787990926, 0.3316897619927337, -1.6023048757009217,
                                        -0.6185022304187324], 4, {"tolerance_change": 1e-12}),
])
def test_the_same_points_as_torch(monkeypatch, objective, start, steps, settings):
    settings = {"max_iter": lbfgs.MAX_ITER, "history_size": lbfgs.HISTORY_SIZE, **settings}
    want, _, _ = torch_lbfgs(objective, torch.tensor(start, dtype=torch.float64), steps, **settings)
    got = our_points(monkeypatch, objective, start, steps, **settings)
    assert len(got) == len(want) >= 4 * steps
    np.testing.assert_allclose(got, np.array(want), rtol=1e-9, atol=1e-12)
