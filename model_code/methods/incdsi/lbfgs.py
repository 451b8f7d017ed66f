"""The optimisation of one IncDSI row: L(v) (``head.py``'s module docstring) minimised with
torch.optim.LBFGS's algorithm and its strong-Wolfe line search, compiled with numba.

Why compiled: an addition optimises one row (d = 384 floats) against at most a few hundred
constraint rows, about 16 loss evaluations of microseconds of arithmetic each. Written in numpy,
every evaluation and iteration was tens of calls costing a few microseconds each, whatever their
size: about 6,800 Python calls an addition, 2.8 ms of an addition's 4.9 ms on a 100k-row head on
a 2-core AMD EPYC (benchmarks/notes/scale.md). Here the whole optimisation is one call.
``cache=True`` keeps the machine code beside this file (or in numba's user cache where that is
read-only), so only the first process after an install compiles (a few seconds).

The algorithm is torch 2.x's ``torch/optim/lbfgs.py`` statement for statement
(``_cubic_interpolate``, ``_strong_wolfe``, ``LBFGS.step`` with ``lr`` 1, ``max_iter`` 20,
``max_eval`` 25, ``tolerance_grad`` 1e-7, ``tolerance_change`` 1e-3, ``history_size`` 100, as
the reference code runs it), in float64 whatever the head's dtype, with the reference code's outer
loop around it: up to ``budget`` calls of ``step()``, stopping after a step whose row meets every
margin (the loss without its regulariser is 0) or moved less than ``tolerance``.
``tests/model_code/methods/incdsi/test_lbfgs.py`` compares every evaluated point with
torch.optim.LBFGS's on the same loss by autograd.

The sums over rows are formed over the violated rows only, in row order, one row's product the
same whichever rows surround it: on a subset of the rows that holds every violated one the
evaluation is bitwise the full problem's (``IncDSIHead._optimise``'s active set relies on it).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# the loss's coefficients, in this order, as one float64 array: best_other (the best existing row's
# score on q_bar), lambda1, gamma1, gamma2, lambda2
BEST_OTHER, LAMBDA1, GAMMA1, GAMMA2, LAMBDA2 = range(5)

C1, C2 = 1e-4, 0.9  # the strong-Wolfe conditions' constants (torch's defaults)
TOLERANCE_GRAD = 1e-7
TOLERANCE_CHANGE = 1e-3  # the reference code's
LINE_SEARCH_TOLERANCE = 1e-9  # the line search's own: torch's step() does not pass its tolerance_change on
MAX_ITER = 20
HISTORY_SIZE = 100

compiled = njit(cache=True, error_model="numpy", nogil=True)  # numpy's model: x / 0 is inf or nan, as in torch


@njit(cache=True, error_model="numpy", nogil=True, fastmath={"reassoc"})
def _dot(a, b):
    """a . b, its sum reassociated into SIMD lanes (LLVM's choice, fixed once compiled): a row's
    product rounds the same whichever rows surround it, and about four times faster than in order."""
    total = 0.0
    for j in range(a.shape[0]):
        total += a[j] * b[j]
    return total


@compiled
def _h1(v, q_bar, coefficients):
    """relu(best_other + gamma1 - v . q_bar): how far the row is from winning q_bar by gamma1."""
    return max(coefficients[BEST_OTHER] + coefficients[GAMMA1] - _dot(v, q_bar), 0.0)


@compiled
def constraint_loss(v, q_bar, coefficients, z, own):
    """L(v) without its regulariser: 0 exactly when every margin is met."""
    h1, squares = _h1(v, q_bar, coefficients), 0.0
    for i in range(z.shape[0]):
        hinge = _dot(z[i], v) - own[i] + coefficients[GAMMA2]  # h2_i before its relu
        if hinge > 0.0:
            squares += hinge * hinge
    return coefficients[LAMBDA1] * h1 * h1 + (1.0 - coefficients[LAMBDA1]) * squares


@compiled
def loss_and_gradient(v, q_bar, coefficients, z, own):
    """L(v) and its gradient in closed form, cheaper than autograd for two products:

        dL/dv = -2 lambda1 h1 q_bar + 2 (1 - lambda1) sum_j h2_j z_j + 2 lambda2 v."""
    lambda1, lambda2 = coefficients[LAMBDA1], coefficients[LAMBDA2]
    h1, squares = _h1(v, q_bar, coefficients), 0.0
    pulled = np.zeros(v.shape[0])  # sum_j h2_j z_j, over the violated rows in row order
    for i in range(z.shape[0]):
        row = z[i]
        hinge = _dot(row, v) - own[i] + coefficients[GAMMA2]
        if hinge > 0.0:
            squares += hinge * hinge
            for j in range(row.shape[0]):
                pulled[j] += hinge * row[j]
    gradient = (-2.0 * lambda1 * h1) * q_bar + (2.0 * (1.0 - lambda1)) * pulled + (2.0 * lambda2) * v
    return lambda1 * h1 * h1 + (1.0 - lambda1) * squares + lambda2 * _dot(v, v), gradient


@compiled
def _cubic_interpolate(x1, f1, g1, x2, f2, g2, xmin_bound, xmax_bound):
    """The minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clamped to the bounds."""
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1**2 - g1 * g2
    if d2_square >= 0:
        d2 = math.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


@compiled
def _evaluate(x, q_bar, coefficients, z, own, points, counter):
    """The loss and gradient at ``x``, recording ``x`` as evaluated point number ``counter[0]``."""
    points[counter[0]] = x
    counter[0] += 1
    return loss_and_gradient(x, q_bar, coefficients, z, own)


@compiled
def _strong_wolfe(x, t, d, f, g, gtd, q_bar, coefficients, z, own, points, counter, max_ls):
    """A step t along d from x meeting the strong Wolfe conditions: (loss, gradient, t, evaluations)."""
    d_norm = np.abs(d).max()
    f_new, g_new = _evaluate(x + t * d, q_bar, coefficients, z, own, points, counter)
    ls_func_evals = 1
    gtd_new = _dot(g_new, d)

    # bracket an interval containing a point satisfying the Wolfe criteria
    t_prev, f_prev, g_prev, gtd_prev = 0.0, f, g, gtd
    done = False
    ls_iter = 0
    bracket, bracket_f, bracket_gtd = np.zeros(2), np.zeros(2), np.zeros(2)
    bracket_g = np.zeros((2, d.shape[0]))
    while ls_iter < max_ls:
        if f_new > (f + C1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket[0], bracket_f[0], bracket_g[0], bracket_gtd[0] = t_prev, f_prev, g_prev, gtd_prev
            bracket[1], bracket_f[1], bracket_g[1], bracket_gtd[1] = t, f_new, g_new, gtd_new
            break
        if abs(gtd_new) <= -C2 * gtd:
            bracket[:], bracket_f[:], bracket_g[0], bracket_g[1] = t, f_new, g_new, g_new  # torch's [t]: one point
            done = True
            break
        if gtd_new >= 0:
            bracket[0], bracket_f[0], bracket_g[0], bracket_gtd[0] = t_prev, f_prev, g_prev, gtd_prev
            bracket[1], bracket_f[1], bracket_g[1], bracket_gtd[1] = t, f_new, g_new, gtd_new
            break
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, min_step, max_step)
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new, gtd_new
        f_new, g_new = _evaluate(x + t * d, q_bar, coefficients, z, own, points, counter)
        ls_func_evals += 1
        gtd_new = _dot(g_new, d)
        ls_iter += 1
    if ls_iter == max_ls:
        bracket[0], bracket_f[0], bracket_g[0] = 0.0, f, g
        bracket[1], bracket_f[1], bracket_g[1] = t, f_new, g_new

    # zoom phase: refine the bracket until a point satisfies the criteria
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < LINE_SEARCH_TOLERANCE:
            break
        lower, upper = (bracket[0], bracket[1]) if bracket[0] <= bracket[1] else (bracket[1], bracket[0])
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1],
                               lower, upper)
        # a t too close to the bracket's ends moves 0.1 of its length inwards (after one such step, or at an end)
        top, bottom = max(bracket[0], bracket[1]), min(bracket[0], bracket[1])
        eps = 0.1 * (top - bottom)
        if min(top - t, t - bottom) < eps:
            if insuf_progress or t >= top or t <= bottom:
                t = top - eps if abs(t - top) < abs(t - bottom) else bottom + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new = _evaluate(x + t * d, q_bar, coefficients, z, own, points, counter)
        ls_func_evals += 1
        gtd_new = _dot(g_new, d)
        ls_iter += 1
        if f_new > (f + C1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos], bracket_g[high_pos], bracket_gtd[high_pos] = t, f_new, g_new, gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -C2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:  # old high becomes new low
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos], bracket_gtd[high_pos] = bracket_g[low_pos], bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos], bracket_g[low_pos], bracket_gtd[low_pos] = t, f_new, g_new, gtd_new
    return bracket_f[low_pos], bracket_g[low_pos].copy(), bracket[low_pos], ls_func_evals


@compiled
def minimise(start, q_bar, coefficients, z, own, budget, tolerance, max_iter, history_size):
    """Up to ``budget`` L-BFGS steps from ``start`` (each torch's ``optimizer.step(closure)``, the
    history kept between them as torch keeps it in the optimiser's state), stopping after a step
    whose row meets every margin or moved less than ``tolerance``. Every argument float64 and
    contiguous. Returns the row, the steps taken and every point evaluated, the start first and
    each step's final row after its evaluations (``IncDSIHead._optimise`` checks the rows outside
    the active set at each). ``max_iter`` and ``history_size`` are torch's (``MAX_ITER`` and
    ``HISTORY_SIZE`` as the reference runs it), and passed, not defaulted: numba's dispatcher takes
    about 0.2 ms to fill in an omitted argument, more than the optimisation itself."""
    size = start.shape[0]
    if q_bar.shape[0] != size or z.shape[1] != size or own.shape[0] != z.shape[0] or coefficients.shape[0] != 5:
        raise ValueError("minimise: start, q_bar and the rows of z must have one length, own one entry a row of z, "
                         "and coefficients five")  # numba checks no bounds: a mismatch would read past an array
    max_eval = max_iter * 5 // 4
    points = np.empty((1 + budget * (max_eval + 2), size))  # a step evaluates at most max_eval + 1 points
    counter = np.zeros(1, dtype=np.int64)
    points[0] = start
    counter[0] = 1
    x = start.copy()
    # the optimiser's state (torch's state dict), kept from step to step
    n_iter = 0
    d, t = np.zeros(size), 1.0
    capacity = max(1, min(history_size, budget * max_iter))
    old_dirs, old_stps, ro = np.empty((capacity, size)), np.empty((capacity, size)), np.empty(capacity)
    first, count = 0, 0  # the history is a ring: its oldest entry, and how many it holds
    h_diag = 1.0
    prev_flat_grad = np.zeros(size)
    steps = 0
    while steps < budget:
        steps += 1
        previous = x
        # -- one step(): torch's LBFGS.step --
        loss, flat_grad = _evaluate(x, q_bar, coefficients, z, own, points, counter)
        current_evals = 1
        if not np.abs(flat_grad).max() <= TOLERANCE_GRAD:  # as torch: a NaN gradient goes on, as it does there
            for local_iter in range(1, max_iter + 1):
                n_iter += 1
                if n_iter == 1:
                    d = -flat_grad
                    first, count, h_diag = 0, 0, 1.0
                else:
                    y = flat_grad - prev_flat_grad
                    s = d * t
                    ys = _dot(y, s)
                    if ys > 1e-10:
                        if count == capacity:  # shift the history by one
                            first, count = (first + 1) % capacity, count - 1
                        slot = (first + count) % capacity
                        old_dirs[slot], old_stps[slot], ro[slot] = y, s, 1.0 / ys
                        count += 1
                        h_diag = ys / _dot(y, y)
                    # the two-loop recursion: the approximate inverse Hessian times the gradient
                    al = np.empty(count)
                    q = -flat_grad
                    for i in range(count - 1, -1, -1):
                        slot = (first + i) % capacity
                        al[i] = _dot(old_stps[slot], q) * ro[slot]
                        q -= al[i] * old_dirs[slot]
                    d = q * h_diag
                    for i in range(count):
                        slot = (first + i) % capacity
                        be_i = _dot(old_dirs[slot], d) * ro[slot]
                        d += (al[i] - be_i) * old_stps[slot]
                prev_flat_grad = flat_grad
                prev_loss = loss
                t = min(1.0, 1.0 / np.abs(flat_grad).sum()) if n_iter == 1 else 1.0
                gtd = _dot(flat_grad, d)
                if gtd > -TOLERANCE_CHANGE:
                    break
                x_init = x
                loss, flat_grad, t, ls_func_evals = _strong_wolfe(x_init, t, d, loss, flat_grad, gtd, q_bar,
                                                                  coefficients, z, own, points, counter,
                                                                  max_eval - current_evals)
                x = x_init + t * d
                current_evals += ls_func_evals
                if (local_iter == max_iter or current_evals >= max_eval
                        or np.abs(flat_grad).max() <= TOLERANCE_GRAD
                        or np.abs(d * t).max() <= TOLERANCE_CHANGE or abs(loss - prev_loss) < TOLERANCE_CHANGE):
                    break
        # -- the reference code's outer loop --
        points[counter[0]] = x
        counter[0] += 1
        moved = x - previous
        if constraint_loss(x, q_bar, coefficients, z, own) == 0.0 or math.sqrt(_dot(moved, moved)) < tolerance:
            break
    return x, steps, points[: counter[0]]


def compile_ahead() -> None:
    """Compile the optimiser now, or load it from numba's cache: the first addition after an install
    would otherwise spend about 20 CPU-seconds compiling (2-core AMD EPYC), and every process that
    reaches one before the cache is written compiles it too. ``make install`` calls this."""
    rows = np.eye(2, 4)
    minimise(np.zeros(4), np.ones(4), np.array([0.0, 0.5, 1.0, 1.0, 1e-6]), rows, np.ones(2), 1, 1e-3, MAX_ITER,
             HISTORY_SIZE)
