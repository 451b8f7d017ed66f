"""Surviving mutants that are equivalent: (module regex, regex on a changed line, why no test can
kill it). ``report.py`` matches each survivor's changed lines against these; a survivor that no
rule matches is reported as not explained."""

EQUIVALENT = [
    (r".*", r'float\("[-+]?INF"\)', 'float() parses "inf" case-insensitively: the same value'),
    (r".*", r'einsum\("[A-Z,\->]+"', "einsum subscripts in upper case name the same axes"),
    (r".*", r"\.to\(None\)|device=None\)|\(len\(queries\), \)",
     ("device placement: every tensor already lives on the CPU where the tests run (the meta-device tests kill "
     "the placements that matter for a GPU)")),
    (r".*/hierarchical\.py", r"F\.normalize\(centroids, (dim=\+1)?\)",
     "centroids are 2-D: dim=1 (the default) and dim=+1 are the last dimension"),
    (r".*/incdsi\.py", r"capacity = max\(|torch\.empty\(\(capacity, \*t\.shape\[1:\]\), (dtype=None)?\)",
     ("the append buffers' capacity (any capacity above n gives the same rows) or dtype (float32 is torch's "
     "default, the head's dtype)")),
    (r".*/incdsi\.py", r"self\._buffers\[1\]\.data_ptr\(\) != self\.weights\.data_ptr\(\)",
     "re-allocating the append buffers on every addition: slower, same rows"),
    (r".*/incdsi\.py", r"100[01] \* \(time\.perf_counter\(\) - start\)",
     "the millisecond scale of a timing (1000 vs 1001) is below what a wall-clock test can resolve"),
    (r".*/incdsi\.py", r"ROUNDING = ",
     "the allowance only moves rows that stay unviolated into the active set, which changes nothing (by design)"),
    (r".*/incdsi\.py", r"ACTIVE_ROWS = ",
     "the initial active-set size does not change the row (what test_active_set_grows_... checks)"),
    (r".*/incdsi\.py", r"topk\(min\(k, len\(self\.doc_ids\)\), \)", "topk on 2-D scores: the default dim is the last"),
    (r".*/incdsi\.py", r"torch\.nonzero\(initial",
     ("which rows start in the active set: a row violated at the start and left out is found at the start point "
     "(the first evaluated point) and added, and the run repeated, so the row is the same")),
    (r".*/incdsi\.py", r"outside = torch\.ones\(len\(self\.doc_ids\), (dtype=None)?\)",
     "a float mask instead of a bool one: nonzero() finds the same rows"),
    (r".*/incdsi\.py", r"^if len\(outside\):$",
     "every outside row joins the set and the run is repeated on all rows: the full problem itself, slower"),
    (r".*/incdsi\.py", r"bool\(wins >= best_other\)|\(slack <= 0\)\.all\(\)|slack \+ gamma2 >= -self\.ROUNDING",
     "differs from the strict comparison only on an exact floating-point tie"),
    (r".*/incdsi\.py", r"len\(self\._buffers\[0\]\) != n or",
     "re-allocates whenever the buffer is not full, which it never is then (capacity >= 2n or 64 > n): same rows"),
    (r".*/incdsi\.py", r"^on = h2 >= 0",
     "also sums the rows whose hinge is 0: adds exact zeros"),
    (r".*/hierarchical\.py", r"torch\.as_tensor\(tree\.doc_path, (dtype=None)?\)|known = torch\.tensor\(.*\], (dtype=None)?\)$",
     "dtype inferred instead of stated: doc paths are int64 arrays and the relevance mask is made of bools"),
    (r".*/hierarchical\.py", r"if len\(doc_index\) else 1, count\)",
     "an empty batch's width: max(1, count) = count, as count >= 1 there"),
    (r".*/hierarchical\.py", r"\.topk\(count, largest=False\)", "topk on 2-D keys: the default dim is the last"),
    (r".*/hierarchical\.py", r"masked_fill\(outside, 3\.0\)",
     "any key above 1 sorts after every real key (uniform in [0, 1))"),
    (r".*/contrastive\.py", r"extra\.shape\[2\] > 0|extra\.shape\[1\] >= 0",
     "with no sampled negatives (k = 0) the branch concatenates an empty block: the same scores"),
    (r".*/hierarchical\.py", (r"n_parents = int\(parent\.max\(\)\) \+ [12] if (\(len\(parent\)\)) or True|n_parents = "
     r"int\(parent\.max\(\)\) \+ 2 if|else 2$"),
     "every level has nodes (len(parent) > 0 always); one more parent row is an unused row of -1 padding"),
    (r".*/hierarchical\.py", r"np\.bincount\(parent, \)", "minlength is max + 1 anyway"),
    (r".*/hierarchical\.py", r"table = np\.full\(\(n_parents, counts\.max\(\)\), -(1, (dtype=None)?|2, dtype=np\.int64)\)",
     "the padding of the children table: int64 inferred from -1, and any negative value is masked and clamped alike"),
    (r".*/hierarchical\.py", r"np\.argsort\(key, (kind=None|kind=\"STABLE\")?\)",
     ("the order of documents inside a node only decides which document a random position names: positions are "
     "drawn uniformly and the positive's own position is derived from the same order")),
    (r".*/hierarchical\.py", r"position = np\.empty\(n_docs, (dtype=None)?\)",
     "float64 positions hold the same integers; they only enter comparisons and additions with integer draws"),
]
