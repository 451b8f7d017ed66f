"""Contrastive losses computed by hand on Python lists (temperature ``TAU``), for the tests of the training
objectives: the bidirectional loss with hard negatives (``by_hand``) and MLR's loss for each pooling
(``mlr_by_hand``)."""

from __future__ import annotations

import math

import numpy as np

TAU = 0.5


def by_hand(q, p, hard, excluded, rows=None):
    """The bidirectional loss by hand over ``rows`` (default all): row i's query against every
    in-batch passage and every hard negative it may count (not excluded), target its own passage;
    passages against the queries."""
    def nll(target, logits):
        return -target + math.log(sum(math.exp(x) for x in logits))

    def dot(a, b):
        return float(np.dot(a, b)) / TAU

    rows = range(len(q)) if rows is None else rows
    forward = [nll(dot(q[i], p[i]), [dot(q[i], pj) for pj in p]
                   + [dot(q[i], h) for h, out in zip(hard, excluded[i]) if not out]) for i in rows]
    backward = [nll(dot(p[i], q[i]), [dot(p[i], qj) for qj in q]) for i in rows]
    return sum(forward) / len(rows) + sum(backward) / len(rows)


def mlr_by_hand(q, d, h, pooling, weights=None, reg_weight=0.0):
    """The loss by hand. q: queries (B, dim); d: their positives' layer vectors (B, m, dim), last
    layer first; h: every query's hard negatives (N, m, dim). A candidate's score is max / mean /
    weighted sum over its layer scores; self_contrastive scores the positive pair with the last
    layer and adds reg_weight * CE over the positive's layer scores towards the last layer. Query
    -> passage over the in-batch positives and h, passage -> query over the queries; means over
    the rows, the two directions summed."""
    def layer(qi, doc):
        return [float(np.dot(qi, v)) for v in doc]

    def score(qi, doc, positive):
        s = layer(qi, doc)
        if pooling == "self_contrastive":
            return s[0] if positive else max(s)
        if pooling == "multi":
            return max(s)
        if pooling == "mean":
            return sum(s) / len(s)
        return sum(w * x for w, x in zip(weights, s))

    def nll(target, logits):
        return -target + math.log(sum(math.exp(x) for x in logits))

    b = len(q)
    forward = sum(nll(score(q[i], d[i], True) / TAU, [score(q[i], d[c], c == i) / TAU for c in range(b)]
                      + [score(q[i], n, False) / TAU for n in h]) for i in range(b)) / b
    backward = sum(nll(score(q[i], d[i], True) / TAU, [score(q[c], d[i], c == i) / TAU for c in range(b)])
                   for i in range(b)) / b
    total = forward + backward
    if pooling == "self_contrastive":
        total += reg_weight * sum(nll(layer(q[i], d[i])[0] / TAU, [x / TAU for x in layer(q[i], d[i])])
                                  for i in range(b)) / b
    return total
