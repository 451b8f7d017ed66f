"""torch.optim.LBFGS with the strong-Wolfe line search, on one numpy vector.

An IncDSI addition optimises one row (d = 384 floats) against at most a few hundred constraint rows,
so a loss evaluation is a few microseconds of arithmetic. torch.optim.LBFGS spends about a hundred
tensor operations per iteration (a few microseconds of dispatch each) plus its ``Optimizer``
bookkeeping: on a 100k-row head pruned to 64 candidates that was about 4 of an addition's 6 ms
(benchmarks/notes/incdsi.md). This is the same algorithm, statement for statement (torch 2.x's
``torch/optim/lbfgs.py``: ``_cubic_interpolate``, ``_strong_wolfe``, ``LBFGS.step``), with the
vectors as numpy arrays and the scalars as Python floats. It takes torch's steps up to rounding
(``tests/model_code/methods/incdsi/test_lbfgs.py`` compares the iterates). Only what IncDSI uses
is kept: one flat parameter, ``lr`` 1, the strong-Wolfe line search, torch's other defaults
(``max_iter`` 20, ``max_eval`` 25, ``tolerance_grad`` 1e-7, ``history_size`` 100).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Objective = Callable[[np.ndarray], tuple[float, np.ndarray]]  # x -> (loss, gradient); a new gradient array each call


def _cubic_interpolate(x1: float, f1: float, g1: float, x2: float, f2: float, g2: float,
                       bounds: tuple[float, float] | None = None) -> float:
    """The minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clamped to ``bounds``; in
    numpy floats, so that a zero denominator gives inf or nan, as torch's tensors do, not an error."""
    xmin_bound, xmax_bound = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    x1, f1, g1, x2, f2, g2 = (np.float64(value) for value in (x1, f1, g1, x2, f2, g2))
    with np.errstate(divide="ignore", invalid="ignore"):
        d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
        d2_square = d1**2 - g1 * g2
        if not d2_square >= 0:  # nan included
            return (xmin_bound + xmax_bound) / 2.0
        d2 = np.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return float(min(max(min_pos, xmin_bound), xmax_bound))


def _strong_wolfe(fun: Objective, x: np.ndarray, t: float, d: np.ndarray, f: float, g: np.ndarray, gtd: float,
                  c1: float = 1e-4, c2: float = 0.9, tolerance_change: float = 1e-9,
                  max_ls: int = 25) -> tuple[float, np.ndarray, float, int]:
    """A step t along d from x meeting the strong Wolfe conditions: (loss, gradient, t, evaluations)."""
    d_norm = float(np.abs(d).max())
    f_new, g_new = fun(x + t * d)
    ls_func_evals = 1
    gtd_new = float(g_new @ d)

    # bracket an interval containing a point satisfying the Wolfe criteria
    t_prev, f_prev, g_prev, gtd_prev = 0.0, f, g, gtd
    done = False
    ls_iter = 0
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f, bracket_g, bracket_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f, bracket_g, bracket_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new], [gtd_prev, gtd_new]
            break
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new, gtd_new
        f_new, g_new = fun(x + t * d)
        ls_func_evals += 1
        gtd_new = float(g_new @ d)
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0.0, t], [f, f_new], [g, g_new]

    # zoom phase: refine the bracket until a point satisfies the criteria
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
        # a t too close to the bracket's ends moves 0.1 of its length inwards (after one such step, or at an end)
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                t = max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket)) else min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new = fun(x + t * d)
        ls_func_evals += 1
        gtd_new = float(g_new @ d)
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos], bracket_g[high_pos], bracket_gtd[high_pos] = t, f_new, g_new, gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:  # old high becomes new low
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos], bracket_gtd[high_pos] = bracket_g[low_pos], bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos], bracket_g[low_pos], bracket_gtd[low_pos] = t, f_new, g_new, gtd_new
    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


class LBFGS:
    """``torch.optim.LBFGS([x], lr=1, tolerance_change=..., line_search_fn="strong_wolfe")`` on the
    vector ``x``: each ``step()`` is one ``optimizer.step(closure)``, the history kept between steps
    as torch keeps it in the optimiser's state; ``x`` is replaced (never changed in place) by each step."""

    def __init__(self, fun: Objective, x: np.ndarray, tolerance_change: float, max_iter: int = 20,
                 tolerance_grad: float = 1e-7, history_size: int = 100):
        self.fun, self.x = fun, x
        self.tolerance_change, self.tolerance_grad, self.history_size = tolerance_change, tolerance_grad, history_size
        self.max_iter, self.max_eval = max_iter, max_iter * 5 // 4
        self.n_iter = 0  # over all steps, as torch's state["n_iter"]
        self.d: np.ndarray | None = None
        self.t = 1.0
        self.old_dirs: list[np.ndarray] = []
        self.old_stps: list[np.ndarray] = []
        self.ro: list[float] = []
        self.h_diag = 1.0
        self.prev_flat_grad: np.ndarray | None = None

    def step(self) -> None:
        """One optimisation step (up to ``max_iter`` iterations)."""
        loss, flat_grad = self.fun(self.x)
        current_evals = 1
        if np.abs(flat_grad).max() <= self.tolerance_grad:
            return
        d, t = self.d, self.t
        for n_iter in range(1, self.max_iter + 1):
            self.n_iter += 1
            if self.n_iter == 1:
                d = -flat_grad
                self.old_dirs, self.old_stps, self.ro, self.h_diag = [], [], [], 1.0
            else:
                y = flat_grad - self.prev_flat_grad
                s = d * t
                ys = float(y @ s)
                if ys > 1e-10:
                    if len(self.old_dirs) == self.history_size:  # shift the history by one
                        del self.old_dirs[0], self.old_stps[0], self.ro[0]
                    self.old_dirs.append(y)
                    self.old_stps.append(s)
                    self.ro.append(1.0 / ys)
                    self.h_diag = ys / float(y @ y)
                # the two-loop recursion: the approximate inverse Hessian times the gradient
                al = [0.0] * len(self.old_dirs)
                q = -flat_grad
                for i in range(len(self.old_dirs) - 1, -1, -1):
                    al[i] = float(self.old_stps[i] @ q) * self.ro[i]
                    q -= al[i] * self.old_dirs[i]
                d = r = q * self.h_diag
                for i in range(len(self.old_dirs)):
                    be_i = float(self.old_dirs[i] @ r) * self.ro[i]
                    r += (al[i] - be_i) * self.old_stps[i]
            self.prev_flat_grad = flat_grad
            prev_loss = loss
            t = min(1.0, 1.0 / float(np.abs(flat_grad).sum())) if self.n_iter == 1 else 1.0
            gtd = float(flat_grad @ d)
            if gtd > -self.tolerance_change:
                break
            x_init = self.x
            loss, flat_grad, t, ls_func_evals = _strong_wolfe(
                self.fun, x_init, t, d, loss, flat_grad, gtd, max_ls=self.max_eval - current_evals)
            self.x = x_init + t * d
            current_evals += ls_func_evals
            if (n_iter == self.max_iter or current_evals >= self.max_eval
                    or np.abs(flat_grad).max() <= self.tolerance_grad
                    or np.abs(d * t).max() <= self.tolerance_change or abs(loss - prev_loss) < self.tolerance_change):
                break
        self.d, self.t = d, t
