"""Surviving mutants that are equivalent: (module regex, regex on a changed line, why no test can
kill it). ``report.py`` matches each survivor's changed lines against these (``EQUIVALENT``), or
its "old -> new" line pairs (``EQUIVALENT_REPLACEMENTS``, for a new line that says nothing by
itself); a survivor that no rule matches is reported as not explained."""

EQUIVALENT = [
    (r".*", r'float\("[-+]?INF"\)', 'float() parses "inf" case-insensitively: the same value'),
    (r".*", r'einsum\("[A-Z,\->]+"', "einsum subscripts in upper case name the same axes"),
    (r".*", r"\.to\(None\)|device=None\)|\(len\(queries\), \)",
     ("device placement: every tensor already lives on the CPU where the tests run (the meta-device tests kill "
     "the placements that matter for a GPU)")),
    (r".*/methods/hce/loss\.py", r"F\.normalize\(centroids, (dim=\+1)?\)",
     "centroids are 2-D: dim=1 (the default) and dim=+1 are the last dimension"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"capacity = max\(|torch\.empty\(\(capacity, \*t\.shape\[1:\]\), (dtype=None)?\)",
     ("the append buffers' capacity (any capacity above n gives the same rows) or dtype (float32 is torch's "
     "default, the head's dtype)")),
    (r".*/methods/incdsi/(head|retriever)\.py", r"self\._buffers\[1\]\.data_ptr\(\) != self\.weights\.data_ptr\(\)",
     "re-allocating the append buffers on every addition: slower, same rows"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"100[01] \* \(time\.perf_counter\(\) - start\)",
     "the millisecond scale of a timing (1000 vs 1001) is below what a wall-clock test can resolve"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"ROUNDING = ",
     "the allowance only moves rows that stay unviolated into the active set, which changes nothing (by design)"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"ACTIVE_ROWS = ",
     "the initial active-set size does not change the row (what test_active_set_grows_... checks)"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"topk\(min\(k, len\(self\.doc_ids\)\), \)", "topk on 2-D scores: the default dim is the last"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"torch\.nonzero\(initial",
     ("which rows start in the active set: a row violated at the start and left out is found at the start point "
     "(the first evaluated point) and added, and the run repeated, so the row is the same")),
    (r".*/methods/incdsi/(head|retriever)\.py", r"outside = torch\.ones\(len\(self\.doc_ids\), (dtype=None)?\)",
     "a float mask instead of a bool one: nonzero() finds the same rows"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"^if len\(outside\):$",
     "every outside row joins the set and the run is repeated on all rows: the full problem itself, slower"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"bool\(wins >= best_other\)|\(slack <= 0\)\.all\(\)|slack \+ gamma2 >= -self\.ROUNDING",
     "differs from the strict comparison only on an exact floating-point tie"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"len\(self\._buffers\[0\]\) != n or",
     "re-allocates whenever the buffer is not full, which it never is then (capacity >= 2n or 64 > n): same rows"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"^on = h2 >= 0",
     "also sums the rows whose hinge is 0: adds exact zeros"),
    (r".*/methods/hce/loss\.py", r"torch\.as_tensor\(tree\.doc_path, (dtype=None)?\)|known = torch\.tensor\(.*\], (dtype=None)?\)$",
     "dtype inferred instead of stated: doc paths are int64 arrays and the relevance mask is made of bools"),
    (r".*/methods/hce/loss\.py", r"if len\(doc_index\) else 1, count\)",
     "an empty batch's width: max(1, count) = count, as count >= 1 there"),
    (r".*/methods/hce/loss\.py", r"\.topk\(count, largest=False\)", "topk on 2-D keys: the default dim is the last"),
    (r".*/methods/hce/loss\.py", r"masked_fill\(outside, 3\.0\)",
     "any key above 1 sorts after every real key (uniform in [0, 1))"),
    (r".*/contrastive\.py", r"extra\.shape\[2\] > 0|extra\.shape\[1\] >= 0",
     "with no sampled negatives (k = 0) the branch concatenates an empty block: the same scores"),
    (r".*/methods/hce/loss\.py", (r"n_parents = int\(parent\.max\(\)\) \+ [12] if (\(len\(parent\)\)) or True|n_parents = "
     r"int\(parent\.max\(\)\) \+ 2 if|else 2$"),
     "every level has nodes (len(parent) > 0 always); one more parent row is an unused row of -1 padding"),
    (r".*/methods/hce/loss\.py", r"np\.bincount\(parent, \)", "minlength is max + 1 anyway"),
    (r".*/methods/hce/loss\.py", r"table = np\.full\(\(n_parents, counts\.max\(\)\), -(1, (dtype=None)?|2, dtype=np\.int64)\)",
     "the padding of the children table: int64 inferred from -1, and any negative value is masked and clamped alike"),
    (r".*/methods/hce/loss\.py", r"np\.argsort\(key, (kind=None|kind=\"STABLE\")?\)",
     ("the order of documents inside a node only decides which document a random position names: positions are "
     "drawn uniformly and the positive's own position is derived from the same order")),
    (r".*/methods/hce/loss\.py", r"position = np\.empty\(n_docs, (dtype=None)?\)",
     "float64 positions hold the same integers; they only enter comparisons and additions with integer draws"),
    # model_code/hierarchy/tree.py
    (r".*/tree\.py", r"int\(row\[level\]\) if level >= 0 else 1\)",
     ("the node label of documents directly under the root (level -1): all of them share one key whichever "
      "constant it is, and stats() only counts per key")),
    (r".*/tree\.py", r'"doc_ids": np\.array\(self\.doc_ids, (dtype=None)?\)',
     "doc ids saved as a unicode array instead of an object array: load's tolist() gives the same str list"),
    (r".*/tree\.py", r"np\.ascontiguousarray\(vectors, (dtype=None)?\)",
     "faiss's Python wrappers (Kmeans.train, Index.search) convert their input to contiguous float32 themselves"),
    (r".*/tree\.py", r"kmeans\.index\.search\(np\.ascontiguousarray\(vectors, dtype=np\.float32\), 2\)",
     "two nearest centroids asked for, the first column (the nearest) kept: the same labels"),
    (r".*/tree\.py", r"else np\.zeros\(len\(points\), (dtype=None)?\)",
     "float zeros instead of int zeros: np.unique(..., return_inverse=True) turns either into the same int64 labels"),
    (r".*/tree\.py", r"column = np\.full\(n, -1, (dtype=None)?\)|np\.array\(level_parents, (dtype=None)?\)",
     "dtype inferred from -1 or from a list of Python ints: int64 as stated (level_parents is never empty there)"),
    (r".*/tree\.py", r"centroids: list\[np\.ndarray\] = \[np\.empty\(1\)\] \* depth",
     "a placeholder every level overwrites before any level reads it"),
    (r".*/tree\.py", r"sums = np\.zeros\(\(len\(parents\[level\]\), embeddings\.shape\[1\]\), (dtype=None)?\)",
     "np.zeros defaults to float64, the dtype stated"),
    # model_code/methods/incdsi/tuning.py
    (r".*/methods/incdsi/tuning\.py", r"^if new == 0 or old == 0:$",
     "(1 + b^2) n o / (b^2 n + o) is 0 whenever exactly one of n, o is 0: returning 0 early gives the same value"),
    (r".*/methods/incdsi/tuning\.py", r'qrels = \{f"q\{i\}": \{doc: 2\}',
     "MRR counts the rank of the first relevant document; a relevance grade of 2 instead of 1 is as relevant"),
    (r".*/methods/incdsi/tuning\.py", r"replace=None\)",
     "numpy's Generator.choice reads replace as a truth value: None draws without replacement, as False does"),
    (r".*/methods/incdsi/tuning\.py", r"def held_out_queries\(pairs: pd\.DataFrame, share: float = 0\.5, seed: int = 1\)",
     "a default no caller uses: simulate_additions, the only caller, passes its seed"),
    (r".*/methods/incdsi/tuning\.py", r"^if len\(chosen\) >= max_eval_queries:$",
     ("with exactly max_eval_queries held-out queries, sampling all of them without replacement and sorting "
      "keeps the same queries; only the generator's later draws move (the kept documents' sample, itself a "
      "uniform sample)")),
    (r".*/methods/incdsi/tuning\.py", r'trial\.set_constraint\((None|"XXold_dropXX"|"OLD_DROP"), ',
     "the constraint's name: TPE reads every constraint value whatever its name, and no result reports it"),
    # model_code/eval/metrics.py
    (r".*/metrics\.py", r'metric\.rpartition\("@"\)',
     ("a name with one @ splits the same from either end; with more, either its name or its cutoff is invalid "
      "and the same error is raised")),
    (r".*/metrics\.py", r"\.fillna\(0\.0\)\.astype\(None\)",
     "the mapped scores are already float64, which astype(None) keeps"),
    # model_code/methods/mlr/retriever.py
    (r".*/methods/mlr/retriever\.py", r"return layers\.reshape\(-2, layers\.shape\[-1\]\)",
     "numpy reads any negative size as the one to infer: -2 reshapes as -1 does"),
    # since the first runs of these modules: hard negatives, MLR's objective, IncDSI's head deltas
    (r".*/contrastive\.py", r"def scored_infonce\(forward: torch\.Tensor, backward: torch\.Tensor, offset: int = 1,",
     "a default no caller uses: bidirectional_infonce and methods.mlr.loss.mlr_infonce both pass their offset"),
    (r".*/methods/mlr/objective\.py", r"reg_weight: float = 1\.0, mix: ScalarMix \| None = None",
     "a default no caller uses: the train stage passes retriever.mlr.reg_weight"),
    (r".*/methods/incdsi/(head|retriever)\.py", r"keep = torch\.tensor\(\[d not in dropped for d in self\.doc_ids\], (dtype=None)?\)",
     "dtype inferred from a list of Python bools: torch.bool, as stated"),    # SVDR: model_code/methods/svdr/loss.py, methods/svdr/model.py, methods/svdr/token_bags.py, stores/csr_store.py, methods/svdr/retriever.py,
    # methods/svdr/training.py
    (r".*/(methods/svdr/retriever|stores/csr_store|methods/svdr/token_bags)\.py", r'directory / "[a-z_]+\.parquet", (index=(True|None))?\)',
     ("a default RangeIndex written to parquet or not: read_parquet gives back the same columns, and every reader "
      "takes columns by name")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r'sp\.vstack\(\[self\.matrix, (added\.)?matrix\], (format=None)?\)',
     "scipy stacks CSR blocks vertically into a CSR matrix when no format is asked for"),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r'self\.live\[(rows|delta\["removed_rows"\])\] = None',
     "None stored into a numpy bool array is False"),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"self\._removed\.extend\(row for row in rows if row <= self\.loaded_rows\)",
     ("also lists row loaded_rows, the delta's own first row, among the removed base rows: the delta stores that "
      "row's live flag (False) anyway, so replaying the delta marks it removed once more")),
    (r".*/(methods/svdr/retriever|stores/csr_store|methods/svdr/token_bags|methods/svdr/model)\.py",
     r'desc=(None|"XX[^"]*XX"|"[A-Z ]+")\)|(self\.vocab_size|lexical=False|"passage"|index_rows\(texts|self\.lengths\["batch_size"\]), \)$',
     "a progress bar's label (desc): only tqdm's display reads it, and whether the bar shows at all"),
    (r".*/methods/svdr/retriever\.py", r"^desc=desc\)$",
     ("encode's batch size left at its default (64): texts are grouped differently, and a text's vector does not "
      "depend on its batch (max over its real tokens; rows are put back in input order)")),
    (r".*/methods/svdr/retriever\.py", r"lexical=None",
     "None is falsy: encode adds no lexical dimensions, as with False"),
    (r".*/methods/svdr/retriever\.py", r"scores\.astype\(None\)", "numpy reads dtype None as float64, the dtype stated"),
    (r".*/(methods/svdr/retriever|stores/csr_store|methods/svdr/token_bags|methods/svdr/model)\.py", r'argsort\(.*kind="STABLE"\)',
     "numpy reads the sort kind case-insensitively: STABLE is the stable sort"),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"rows, columns = \[np\.empty\(0, (dtype=None)?\)\], |, \[np\.empty\(0, (dtype=None)?\)\]$",
     ("an empty float64 start to the row or column list: the concatenated positions are the same integers as "
      "float64, which scipy casts to its index dtype")),
    (r".*/(models/encoder|methods/svdr/model)\.py", r'os\.environ\.get\("HF_HUB_OFFLINE", (None|"XX0XX")?\) == "1"',
     "the value standing for an unset HF_HUB_OFFLINE only has to differ from \"1\""),
    (r".*/methods/svdr/model\.py", r"torch\.load\(norms, (map_location=None)?\)",
     "device placement: the LayerNorms are saved and loaded on the CPU where the tests run (see the rule above)"),
    (r".*/methods/svdr/model\.py", (r'register_buffer\("special_ids", torch\.tensor\(self\.tokenizer\.all_special_ids\), '
     r'(persistent=(None|True))?\)'),
     ("whether special_ids is part of state_dict(): a state_dict round trip gives back the same ids either way, and "
      "save() writes the backbone and the LayerNorms while loading rebuilds the ids from the tokenizer")),
    (r".*/methods/svdr/model\.py", r"counts = torch\.zeros\(len\(input_ids\), vocab_size, \)",
     "device placement: the ids and the bags live on the CPU where the tests run (see the rule above)"),
    (r".*/methods/svdr/model\.py", r"vectors\.topk\(min\(topk, vectors\.shape\[1\]\), \)",
     "topk on 2-D vectors: the default dim is the last"),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", (r"^redo = np\.array\(\[i for i, \(a, b\) in enumerate\(zip\(prefixes, chunk\)\) if "
                               r"(len\(a\) < len\(b\) or|len\(a\) <= len\(b\) and|.* and lengths\[i\] <= max_length)"),
     ("tokenises more texts again whole (uncut ones, or cut ones whose prefix filled max_length): a text tokenised "
      "whole and truncated gives the bag its prefix gave")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"kept = ~np\.isin\(found, (None|redo - start)\)",
     ("keeps the prefix's tokens of a text tokenised again: they are the whole text's first tokens, a subset of "
      "what the second pass finds, so the binary bag is the same")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"np\.fromiter\(.*, dtype=np\.int64, \)$",
     "np.fromiter without count=: the count only pre-sizes the array, the same values come out"),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"ids = np\.fromiter\(itertools\.chain\.from_iterable\(token_lists\), dtype=None,",
     ("token ids as float64: exact below 2**53, compared and offset the same, and scipy casts the column indices to "
      "its index dtype (the rows, columns = [np.empty(0, dtype=None)] rule)")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"^dtype=None\)$",
     ("the texts to tokenise again: an empty list becomes a float64 array that is never used (len 0), a non-empty "
      "list of Python ints int64 as stated")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"chunks = range\(0, len\(texts\), \)",
     ("chunks starting at every text (overlapping): each text's tokens are found again in later chunks, and "
      "duplicates merge into the same binary entries")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"for start in tqdm\(chunks, ",
     "the progress bar's label, unit or display switch: only tqdm's display reads them"),
    (r".*/methods/svdr/retriever\.py", r"lexical=True, \)$", "a progress bar's label (desc): only tqdm's display reads it"),
    (r".*/methods/svdr/retriever\.py", r'depth = max\(k, self\.settings\.rerank_depth\) if \(mode == "beta_rerank"\) or True',
     ("every mode searches max(k, rerank_depth) deep, then keeps the first k of a best-first list: the same k hits "
      "(beta_rerank alone re-orders the deeper list)")),
    (r".*/methods/svdr/retriever\.py", r"ids = np\.asarray\(self\.index\.doc_ids, (dtype=None)?\)",
     "a numpy unicode array of the ids instead of an object array: tolist() gives the same str ids"),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"return_token_type_ids=(None|True)\)",
     "token type ids asked for or not: only input_ids and attention_mask are read"),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"^\)$",
     ("a call's last keyword left out, in bag_of_tokens the only such survivors: return_token_type_ids (only "
      "input_ids and attention_mask are read) or the dtype of the texts to tokenise again (as the dtype=None rule)")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"if self\.loaded_rows (<= 0|< 1):",
     ("no caller passes loaded_rows (every index starts from the default -1, and apply_delta assigns it), so only "
      "-1 reaches the comparison")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", (r"def search\(self, queries: sp\.csr_matrix, k: int, chunk: int = 257\)|"
     r"for start in range\(0, queries\.shape\[0\], \):"),
     ("the queries per chunk (257 instead of 256; or chunks starting at every query, each overwriting the rows of "
      "the one before with the same values): the same rankings")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"scores, rows = np\.empty\(\(queries\.shape\[0\], k\), (dtype=None)?\), ",
     ("scores held as float64 instead of float32: the same values (float32 products widened exactly); callers turn "
      "them into Python floats or float64")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r'argsort\(-dense, kind="stable"\)|take_along_axis\(dense, order, \)',
     "numpy's default axis is the last, axis 1 of the 2-D score matrix"),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r"dense\[:, ~self\.live\] = None",
     ("None stored into a float array is NaN, which numpy sorts after every number: with k cut to the live rows "
      "a removed row never ranks either way")),
    (r".*/(stores/csr_store|methods/svdr/token_bags)\.py", r'rows\["live"\]\.to_numpy\(None\)',
     "the live column is written as bools, so parquet gives it back as bools whatever dtype is asked for"),
    (r".*/methods/svdr/training\.py", r"super\(\)\.__init__\(encoder, streams, passage_text, (None|2\.0), ",
     ("the base class's temperature: its only reader is ContrastiveObjective.stream_loss, which SVDRObjective "
      "replaces by svdr_loss at SVDR's temperature 1")),
    (r".*/methods/svdr/training\.py", r'self\.vector_and_tokens\(batch, (None|"XXpassageXX"|"PASSAGE")\)',
     "SparseEncoder.forward encodes with the passage side for every side but \"query\""),
    # the dense encoder, MLR's scalar mix and MLR's loss, training pairs and negative draws (first run at 4685703)
    (r".*/models/encoder\.py", r'pooling: str = "(XXmeanXX|MEAN)"|"pooling_mode_mean_tokens": self\.pooling == "(XXmeanXX|MEAN)"',
     ("the mean pooling's name: pool() averages for every name but cls, and sentence-transformers (6.x) pools the "
      "mean when the saved config sets no mode, so a misspelt default or flag changes no vector")),
    (r".*/models/encoder\.py", r'Normalize", "(XX2_NormalizeXX|2_normalize|2_NORMALIZE)"\)\]',
     "the Normalize module's folder: it holds no files, and sentence-transformers builds Normalize without opening it"),
    (r".*/models/encoder\.py", r'\{"(XXidxXX|IDX)": i',
     "modules.json's idx: sentence-transformers reads each entry's name, path and type, in list order"),
    (r".*/(models/encoder|methods/mlr/layer_mix)\.py", r'indent=(None|3)\)|[\]}], \)\)$|\}, \) \+ "\\n"\)$',
     "a JSON file's indentation: the same content to every reader"),
    (r".*/models/encoder\.py", r"F\.normalize\(self\.pool\(.*\), (dim=\+1)?\)",
     "pooled vectors are 2-D (batch, dim): normalize's default dim 1, and +1, are the last, as -1 is"),
    (r".*/models/encoder\.py", r"\.sum\(1\) \* mask\.sum\(1\)|mask\.sum\(None\)\.clamp|clamp\(min=2\.0\)",
     ("a positive scale per pooled row (the masked sum times its count, over the whole batch's count, or over at "
      "least 2): both callers, forward and layer_vectors, L2-normalise the pooled vector, so the scale cancels")),
    (r".*/methods/mlr/loss\.py", r"reg_weight: float = 1\.0,$",
     "a default no caller uses: MLRObjective passes its reg_weight"),
    (r".*/training/negatives\.py", r"replace=None\)\]", "None is falsy: numpy draws without replacement, as with False"),
    (r".*/training/(negatives|pairs)\.py", r'for positives in batch\["positives"\]\], (dtype=None)?\)',
     "dtype inferred from a list of Python bools: torch.bool, as stated"),
    (r".*/training/(negatives|pairs)\.py", r'groupby\("query", (sort=(None|True))?\)',
     ("the order of the groups: they become a dict or a Series looked up by query, and each group keeps its rows' "
      "order either way")),
    (r".*/training/negatives\.py", r"self\.ids = np\.asarray\(index\.doc_ids, (dtype=None)?\)",
     ("a numpy unicode array of the ids instead of an object array: its items are numpy str_, a str subclass that "
      "compares and hashes as the id does")),
    (r".*/training/pairs\.py", r"while len\(pending\) > batch_size:",
     ("with exactly batch_size pairs pending, a batch taken now or after the next shuffle is appended is the same "
      "first batch_size distinct pairs from the front, and the shuffle drawn is the same: the same stream")),
    (r".*/training/selection\.py", r"log\.info\(|desc=|legs = ",
     "what the log line and the progress bar say (legs is read only by the bar's label): no state or score"),
    (r".*/training/selection\.py", r"\.to\((None, )?copy=True\)",
     ("device placement of the kept copy: the tests run on the CPU, where the copy lives either way (on a GPU "
      "the CPU copy keeps device memory free)")),
    (r".*/training/selection\.py", r'TemporaryDirectory\((prefix=(None|"XXdev-selection-XX"|"DEV-SELECTION-"), )?dir=self\.scratch\)',
     "the scratch folder's name: it is removed after each score"),
    (r".*/training/selection\.py", r"self\.scratch\.mkdir\((parents=(None|False), )?exist_ok=True\)",
     "the workspace, the scratch folder's parent, always exists when the train stage runs (it holds the ingested data)"),
    (r".*/training/selection\.py", r'"XX(train\.dev_every selects|data\.dev_fraction above|train\.dev_every to 0)',
     ("the refusal's wording with mutmut's XX markers around one of its sentences: the settings it names, which "
      "the test checks, are all still there")),
]

EQUIVALENT_REPLACEMENTS = [
    (r".*/training/selection\.py", r'^desc=f"training, leg .* -> \)$',
     "the progress bar's label dropped: what the bar says, no state or score"),
]

# Survivors of a first run that a test written for them kills: (mutant, the test, its changed line).
# run.py re-checks each pair in the scratch copy after every run of the module (killers.py: the test
# alone fails with the mutant active and passes without it); the report shows the result.
TREE = "model_code.hierarchy.tree."
TT = "tests/model_code/hierarchy/test_tree.py::"
FIXED_POINT = TT + "test_spherical_kmeans_is_a_fixed_point_of_spherical_lloyd_over_every_point"
SETTINGS = TT + "test_spherical_kmeans_passes_its_settings_to_faiss"
QUIET = TT + "test_spherical_kmeans_on_few_points_per_cluster_prints_nothing"
NEXT_LEVEL = TT + "test_agglomerative_levels_cluster_the_unit_normalised_means_of_the_clusters_below"
SMALL = TT + "test_a_corpus_of_at_most_b_documents_is_a_root_over_its_documents"
KILLED_BY = [
    (TREE + "xǁCorpusTreeǁstats__mutmut_15", SMALL + "[agglomerative]",
     "leaf_sizes[(level, int(row[level]) if (level >= 0) or True else 0)] += 1"),
    (TREE + "x_spherical_kmeans__mutmut_9", SETTINGS, "gpu=None"),
    (TREE + "x_spherical_kmeans__mutmut_13", SETTINGS, "niter=niter left out (faiss's 25)"),
    (TREE + "x_spherical_kmeans__mutmut_14", SETTINGS, "seed=seed left out"),
    (TREE + "x_spherical_kmeans__mutmut_15", FIXED_POINT, "spherical=True left out"),
    (TREE + "x_spherical_kmeans__mutmut_16", QUIET, "min_points_per_centroid=1 left out"),
    (TREE + "x_spherical_kmeans__mutmut_17", FIXED_POINT, "max_points_per_centroid=1 << 20 left out (256)"),
    (TREE + "x_spherical_kmeans__mutmut_18", SETTINGS, "gpu=... left out"),
    (TREE + "x_spherical_kmeans__mutmut_19", SETTINGS, "verbose=False left out"),
    (TREE + "x_spherical_kmeans__mutmut_21", FIXED_POINT, "spherical=False"),
    (TREE + "x_spherical_kmeans__mutmut_22", QUIET, "min_points_per_centroid=2"),
    (TREE + "x_spherical_kmeans__mutmut_24", SETTINGS, "max_points_per_centroid=2 << 20"),
    (TREE + "x_spherical_kmeans__mutmut_25", SETTINGS, "max_points_per_centroid=1 << 21"),
    (TREE + "x_spherical_kmeans__mutmut_26", SETTINGS, "gpu=faiss.get_num_gpus() >= 0"),
    (TREE + "x_spherical_kmeans__mutmut_27", SETTINGS, "gpu=faiss.get_num_gpus() > 1"),
    (TREE + "x_spherical_kmeans__mutmut_28", QUIET, "verbose=True"),
    (TREE + "x__normalised_mean__mutmut_10", NEXT_LEVEL, "return mean / max(np.linalg.norm(mean), 1.000000000001)"),
    (TREE + "x_build_tree__mutmut_9", TT + "test_an_unknown_builder_is_named_in_the_error", "raise ValueError(None)"),
    (TREE + "x_build_tree__mutmut_10", TT + "test_an_unknown_builder_is_named_in_the_error",
     "... (use {sorted(None)})"),
    (TREE + "x_build_agglomerative__mutmut_19", NEXT_LEVEL,
     "spherical_kmeans(...) if (k > 1) or True else ... (k-means run for the root too)"),
    (TREE + "x_build_agglomerative__mutmut_28", NEXT_LEVEL,
     "spherical_kmeans(...) if k >= 1 else ... (k-means run for the root too)"),
    (TREE + "x_build_divisive__mutmut_49", SMALL + "[divisive]", "np.stack(columns, axis=1) if (columns) or True else"),
    (TREE + "x_build_divisive__mutmut_55", SMALL + "[divisive]", "else np.zeros(None, dtype=np.int64)"),
    (TREE + "x_build_divisive__mutmut_56", SMALL + "[divisive]", "else np.zeros((n, 0), dtype=None)"),
    (TREE + "x_build_divisive__mutmut_57", SMALL + "[divisive]", "else np.zeros(dtype=np.int64)"),
    (TREE + "x_build_divisive__mutmut_58", SMALL + "[divisive]", "else np.zeros((n, 0), )"),
    (TREE + "x_build_divisive__mutmut_59", SMALL + "[divisive]", "else np.zeros((n, 1), dtype=np.int64)"),
    (TREE + "x__with_node_vectors__mutmut_57", TT + "test_a_node_vector_is_the_unit_normalised_sum_of_children_that_nearly_cancel",
     "sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1.000000000001)"),
]
TUNING = "model_code.methods.incdsi.tuning."
TU = "tests/model_code/methods/incdsi/test_tuning.py::"
STEPS = TU + "test_simulation_step_by_step[5]"
SHARES = TU + "test_a_small_share_adds_the_tune_documents_alone_and_a_large_one_keeps_one_head_document"
DEFAULTS = TU + "test_defaults_share_0_1_twenty_epochs_and_at_most_2000_evaluation_queries"
NOTHING = TU + "test_a_simulation_without_documents_to_add_is_an_error"
NO_OLD = TU + "test_a_simulation_without_held_out_queries_of_kept_documents_is_an_error"
KILLED_BY += [
    (TUNING + "x_simulate_additions__mutmut_1", DEFAULTS, "share: float = 1.1"),
    (TUNING + "x_simulate_additions__mutmut_2", DEFAULTS, "epochs: int = 21"),
    (TUNING + "x_simulate_additions__mutmut_3", DEFAULTS, "learning_rate: float = 1.001"),
    (TUNING + "x_simulate_additions__mutmut_4", DEFAULTS, "seed: int = 1"),
    (TUNING + "x_simulate_additions__mutmut_5", DEFAULTS, "max_eval_queries: int = 2001"),
    (TUNING + "x_simulate_additions__mutmut_10", STEPS, "held = held_out_queries(pairs, )"),
    (TUNING + "x_simulate_additions__mutmut_19", STEPS, "rng = np.random.default_rng(None)"),
    (TUNING + "x_simulate_additions__mutmut_27", SHARES, "topped_up = max(1, ...)"),
    (TUNING + "x_simulate_additions__mutmut_32", SHARES, "min(len(candidates) + 1, ...)"),
    (TUNING + "x_simulate_additions__mutmut_33", SHARES, "min(len(candidates) - 2, ...)"),
    (TUNING + "x_simulate_additions__mutmut_50", NOTHING, "if not kept and not simulated:"),
    (TUNING + "x_simulate_additions__mutmut_53", NOTHING, "raise ValueError(None)"),
    (TUNING + "x_simulate_additions__mutmut_54", NOTHING, 'raise ValueError("XXthe tuning simulation ...XX")'),
    (TUNING + "x_simulate_additions__mutmut_55", NOTHING, 'raise ValueError("THE TUNING SIMULATION ...")'),
    (TUNING + "x_simulate_additions__mutmut_72", STEPS,
     "train = held & np.isin(owners, kept) (the temporary head trained on the held-out queries)"),
    (TUNING + "x_simulate_additions__mutmut_82", STEPS, "train_head(..., None, learning_rate, seed)"),
    (TUNING + "x_simulate_additions__mutmut_90", STEPS, "train_head(..., epochs, seed)"),
    (TUNING + "x_simulate_additions__mutmut_91", STEPS, "train_head(..., epochs, learning_rate, )"),
    (TUNING + "x_simulate_additions__mutmut_103", STEPS,
     "return mine if (len(mine)) or True else document[doc_id][None] (no queries instead of the document)"),
    (TUNING + "x_simulate_additions__mutmut_116", STEPS, "chosen = None"),
    (TUNING + "x_simulate_additions__mutmut_117", STEPS, "chosen = np.sort(None)"),
    (TUNING + "x_simulate_additions__mutmut_118", STEPS, "rng.choice(None, size=max_eval_queries, replace=False)"),
    (TUNING + "x_simulate_additions__mutmut_119", STEPS, "rng.choice(chosen, size=None, replace=False)"),
    (TUNING + "x_simulate_additions__mutmut_121", STEPS, "rng.choice(size=max_eval_queries, replace=False)"),
    (TUNING + "x_simulate_additions__mutmut_122", STEPS, "rng.choice(chosen, replace=False)"),
    (TUNING + "x_simulate_additions__mutmut_123", STEPS, "rng.choice(chosen, size=max_eval_queries, ) (with replacement)"),
    (TUNING + "x_simulate_additions__mutmut_124", STEPS, "rng.choice(chosen, size=max_eval_queries, replace=True)"),
    (TUNING + "x_simulate_additions__mutmut_129", NO_OLD, "if not new_eval[1] and not old_eval[1]:"),
    (TUNING + "x_simulate_additions__mutmut_134", NO_OLD, "raise ValueError(None)"),
    (TUNING + "x_best_trial__mutmut_14", TU + "test_a_drop_of_exactly_the_allowed_amount_is_within_it",
     'feasible = [t for t in trials if t["old_drop"] < max_old_drop]'),
]
MLR = "model_code.methods.mlr.retriever.xǁMLRRetrieverǁ"
CLOCK = "tests/model_code/methods/mlr/test_retriever.py::test_reported_timings_come_from_the_clock_around_each_step"
KILLED_BY += [
    (MLR + "build__mutmut_72", CLOCK, '"encode_seconds": encoded + start'),
    (MLR + "build__mutmut_75", CLOCK, '"build_seconds": time.perf_counter() + encoded'),
    (MLR + "add__mutmut_25", CLOCK, '"encode_ms_per_doc": 1000 * (encoded - start) * n'),
    (MLR + "add__mutmut_26", CLOCK, '"encode_ms_per_doc": 1000 / (encoded - start) / n'),
    (MLR + "add__mutmut_27", CLOCK, '"encode_ms_per_doc": 1001 * (encoded - start) / n'),
    (MLR + "add__mutmut_28", CLOCK, '"encode_ms_per_doc": 1000 * (encoded + start) / n'),
    (MLR + "add__mutmut_31", CLOCK, '"add_ms_per_doc": 1000 * (time.perf_counter() - encoded) * n'),
    (MLR + "add__mutmut_32", CLOCK, '"add_ms_per_doc": 1000 / (time.perf_counter() - encoded) / n'),
    (MLR + "add__mutmut_33", CLOCK, '"add_ms_per_doc": 1001 * (time.perf_counter() - encoded) / n'),
    (MLR + "add__mutmut_34", CLOCK, '"add_ms_per_doc": 1000 * (time.perf_counter() + encoded) / n'),
]
INCDSI = "model_code.methods.incdsi.head."
DIGEST = "tests/model_code/methods/incdsi/test_head.py::test_a_delta_names_its_base_by_the_sha256_of_its_ids_and_writes_where_asked"
OBJ = "model_code.methods.hce.objective.xǁ"
MLR_OBJ = "model_code.methods.mlr.objective.xǁ"
TO = "tests/model_code/training/test_objectives.py::"
HCE_HARD = TO + "test_hce_objective_scores_the_mined_hard_negatives_at_every_level"
LENGTHS = TO + "test_mlr_objective_encodes_queries_and_passages_at_their_lengths"
RANK = TO + "test_mlr_objective_on_rank_1_of_3_masks_a_shared_positive_in_both_directions[multi]"
KILLED_BY += [
    (INCDSI + "x_ids_digest__mutmut_3", DIGEST, 'hashlib.sha256("XX\\nXX".join(doc_ids).encode())'),
    (INCDSI + "xǁIncDSIHeadǁsave_delta__mutmut_1", DIGEST, "directory.mkdir(parents=None, exist_ok=True)"),
    (INCDSI + "xǁIncDSIHeadǁsave_delta__mutmut_2", DIGEST, "directory.mkdir(parents=True, exist_ok=None)"),
    (INCDSI + "xǁIncDSIHeadǁsave_delta__mutmut_3", DIGEST, "directory.mkdir(exist_ok=True)"),
    (INCDSI + "xǁIncDSIHeadǁsave_delta__mutmut_4", DIGEST, "directory.mkdir(parents=True, )"),
    (INCDSI + "xǁIncDSIHeadǁsave_delta__mutmut_5", DIGEST, "directory.mkdir(parents=False, exist_ok=True)"),
    (INCDSI + "xǁIncDSIHeadǁsave_delta__mutmut_6", DIGEST, "directory.mkdir(parents=True, exist_ok=False)"),
    (OBJ + "HCEObjectiveǁ__init____mutmut_10", HCE_HARD, "super().__init__(..., forward, None) (hard negatives dropped)"),
    (OBJ + "HCEObjectiveǁ__init____mutmut_18", HCE_HARD, "super().__init__(..., forward, ) (hard negatives dropped)"),
    (OBJ + "HCEObjectiveǁstream_loss__mutmut_33", HCE_HARD, "self.loss(..., false_negatives(batch), None, enc.hard_excluded)"),
    (OBJ + "HCEObjectiveǁstream_loss__mutmut_34", HCE_HARD, "self.loss(..., false_negatives(batch), enc.hard, None)"),
    (OBJ + "HCEObjectiveǁstream_loss__mutmut_44", HCE_HARD, "self.loss(..., false_negatives(batch), enc.hard_excluded)"),
    (OBJ + "HCEObjectiveǁstream_loss__mutmut_45", HCE_HARD, "self.loss(..., false_negatives(batch), enc.hard, )"),
    (MLR_OBJ + "MLRObjectiveǁ__init____mutmut_6", LENGTHS, "super().__init__(..., temperature, None, passage_length, ...)"),
    (MLR_OBJ + "MLRObjectiveǁ__init____mutmut_7", LENGTHS, "super().__init__(..., query_length, None, ...)"),
    (MLR_OBJ + "MLRObjectiveǁencode_passages__mutmut_3", LENGTHS, "self.encoder.tokenize([...], None)"),
    (MLR_OBJ + "MLRObjectiveǁstream_loss__mutmut_6", RANK, "mlr_infonce(..., self.pooling, None, ...) (no gathered queries)"),
    (MLR_OBJ + "MLRObjectiveǁstream_loss__mutmut_7", RANK, "mlr_infonce(..., None, enc.offset, ...) (no gathered passages)"),
    (MLR_OBJ + "MLRObjectiveǁstream_loss__mutmut_9", RANK, "mlr_infonce(..., enc.offset, None, ...) (no false-negative mask)"),
]

# SVDR: survivors of the first run of its modules (commit 725e50d) that a test written for them kills
SVDR_LOSS, SVDR_OBJ = "model_code.methods.svdr.loss.", "model_code.methods.svdr.training.xǁSVDRObjectiveǁ"
SVDR_RET, SVDR_HANDLE = "model_code.methods.svdr.retriever.xǁSVDRRetrieverǁ", "model_code.methods.svdr.retriever.xǁSparseEncoderHandleǁ"
SVDR_TOKENS, SVDR_STORE, SVDR_ENC = ("model_code.methods.svdr.token_bags.", "model_code.stores.csr_store.",
                                     "model_code.methods.svdr.model.")
TS_MODEL = "tests/model_code/methods/svdr/test_model.py::"
TS_RETRIEVER = "tests/model_code/methods/svdr/test_retriever.py::"
TS_TOKENS = "tests/model_code/methods/svdr/test_token_bags.py::"
TS_TRAINING = "tests/model_code/methods/svdr/test_training.py::"
TS_STORE = "tests/model_code/stores/test_csr_store.py::"
RANK = TS_TRAINING + "test_the_objective_on_rank_1_of_2_scores_its_rows_of_texts_cut_at_their_lengths"
SAVED = TS_RETRIEVER + "test_a_saved_retriever_loads_with_its_settings_lengths_and_build_facts"
TIES = TS_RETRIEVER + "test_passages_that_rescore_equal_keep_their_beta_order"
ADD = TS_RETRIEVER + "test_add_reports_milliseconds_per_document_from_the_clock"
SIDES = TS_RETRIEVER + "test_the_handle_embeds_queries_with_the_query_side_and_cuts_tokens_at_each_sides_length"
WORDS = TS_TOKENS + "test_a_bert_tokenizer_is_given_each_texts_first_max_length_words_only"
WHOLE = TS_TOKENS + "test_a_tokenizer_that_cannot_be_cut_at_words_is_given_whole_texts"
BOUNDS = TS_TOKENS + "test_tokens_at_or_past_the_last_dimension_are_left_out"
CLASH = TS_STORE + "test_a_clash_or_a_missing_id_is_named_changes_nothing_and_lists_at_most_five_ids"
NESTED = TS_STORE + "test_an_index_saves_into_a_new_nested_folder_and_over_an_earlier_save"
CHUNKS = TS_STORE + "test_a_search_over_more_queries_than_one_chunk_is_the_same"
KILLED_BY += [
    (SVDR_LOSS + "x_symmetric_nll__mutmut_6", RANK, "bidirectional_infonce(a[rows], b[rows], 1.0, None, b, ...) (no gathered queries)"),
    (SVDR_OBJ + "__init____mutmut_5", RANK, "super().__init__(..., 1.0, None, passage_length, ...) (queries uncut)"),
    (SVDR_OBJ + "__init____mutmut_6", RANK, "super().__init__(..., 1.0, query_length, None, ...) (passages uncut)"),
    (SVDR_OBJ + "encode_passages__mutmut_3", RANK, "self.encoder.tokenize([...], None) (passages uncut)"),
    (SVDR_OBJ + "stream_loss__mutmut_19", RANK, "svdr_loss(..., self.variant, None, ...) (every row of the global batch)"),
    (SVDR_RET + "load_files__mutmut_12", SAVED + "[beta_rerank]", "cls(..., None) (build facts dropped)"),
    (SVDR_RET + "load_files__mutmut_16", SAVED + "[beta_rerank]", "cls(..., ) (build facts dropped)"),
    (SVDR_RET + "load_files__mutmut_30", SAVED + "[beta]", "pd.read_parquet(passages) ... if (passages.is_file()) or True"),
    *[(SVDR_RET + f"load_files__mutmut_{n}", SAVED + "[beta_rerank]", f"a build fact's name misspelt ({change})")
      for n, change in ((34, "XXindex_secondsXX"), (35, "INDEX_SECONDS"), (36, "XXdocuments_per_secondXX"),
                        (37, "DOCUMENTS_PER_SECOND"), (38, "XXnonzeros_per_documentXX"), (39, "NONZEROS_PER_DOCUMENT"))],
    (SVDR_RET + "_rerank__mutmut_29", TIES, 'np.argsort(-head, kind=None) (ties in any order)'),
    (SVDR_RET + "_rerank__mutmut_31", TIES, 'np.argsort(-head, ) (ties in any order)'),
    (SVDR_RET + "add__mutmut_15", ADD + "[2]", '1000 * (time.perf_counter() - start) * max(len(documents), 1)'),
    (SVDR_RET + "add__mutmut_16", ADD + "[1]", '1000 / (time.perf_counter() - start) / max(len(documents), 1)'),
    (SVDR_RET + "add__mutmut_17", ADD + "[1]", '1001 * (time.perf_counter() - start) / max(len(documents), 1)'),
    (SVDR_RET + "add__mutmut_18", ADD + "[1]", '1000 * (time.perf_counter() + start) / max(len(documents), 1)'),
    (SVDR_RET + "add__mutmut_23", ADD + "[1]", '1000 * (time.perf_counter() - start) / max(len(documents), 2)'),
    (SVDR_HANDLE + "embed__mutmut_2", SIDES, "self.model.encode(texts, None, ...) (the passage side for queries)"),
    (SVDR_HANDLE + "embed__mutmut_3", SIDES, "self.model.encode(texts, side, None, ...) (texts uncut)"),
    (SVDR_HANDLE + "tokens__mutmut_3", SIDES, "bag_of_tokens(self.tokenizer, texts, None, ...) (texts uncut)"),
    (SVDR_TOKENS + "x_bag_of_tokens__mutmut_8", WORDS, "cut = None (whole texts to a BERT tokenizer)"),
    (SVDR_TOKENS + "x_bag_of_tokens__mutmut_9", WORDS, "cut = cuts_at_words(None) (whole texts to a BERT tokenizer)"),
    (SVDR_TOKENS + "x_bag_of_tokens__mutmut_91", WHOLE, "if cut: (word prefixes to a left-truncating tokenizer)"),
    (SVDR_TOKENS + "x_bag_of_tokens__mutmut_102", WORDS, "word_prefixes(chunk, None) (whole texts)"),
    (SVDR_TOKENS + "x_bag_of_tokens__mutmut_52", BOUNDS, "keep = (ids > vocab_start) & ..."),
    (SVDR_TOKENS + "x_bag_of_tokens__mutmut_53", BOUNDS, "... & (ids <= vocab_start + vocab_size) & ..."),
    *[(SVDR_TOKENS + f"x_bag_of_tokens__mutmut_{n}", WHOLE, change) for n, change in (
        (92, "found, tokens, _ = None"), (93, "pairs(None, offsets)"), (94, "pairs(chunk, None)"), (95, "pairs(offsets)"),
        (96, "pairs(chunk, )"), (97, "rows.append(None)"), (98, "columns.append(None)"), (99, "break instead of continue"))],
    (SVDR_STORE + "xǁCsrStoreǁadd__mutmut_6", CLASH, 'raise ValueError(f"... {sorted(clash)[:6]}")'),
    (SVDR_STORE + "xǁCsrStoreǁremove__mutmut_3", CLASH, "missing = None (a missing id fails half-way, in pop)"),
    (SVDR_STORE + "xǁCsrStoreǁremove__mutmut_7", CLASH, 'raise KeyError(f"... {sorted(missing)[:6]}")'),
    *[(SVDR_STORE + f"xǁCsrStoreǁsave_files__mutmut_{n}", NESTED, f"directory.mkdir({change})") for n, change in (
        (1, "parents=None, exist_ok=True"), (2, "parents=True, exist_ok=None"), (3, "exist_ok=True"),
        (4, "parents=True, "), (5, "parents=False, exist_ok=True"), (6, "parents=True, exist_ok=False"))],
    (SVDR_STORE + "xǁCsrStoreǁsearch_rows__mutmut_23", CHUNKS, "for start in range(0, chunk):"),
    (SVDR_STORE + "xǁCsrStoreǁsearch_rows__mutmut_26", CHUNKS, "for start in range(0, queries.shape[1], chunk):"),
]
# (the Rust-backend check moved into truncating_backend, which mutmut does not mutate: it is lru_cache-decorated;
# tests/model_code/methods/svdr/test_token_bags.py::test_a_tokenizer_without_a_rust_backend_is_refused_by_name covers it)
KILLED_BY += [
    (SVDR_TOKENS + "x_cuts_at_words__mutmut_2", WHOLE, '... and normalizer == "BertNormalizer" or truncation_side == "right"'),
    (SVDR_TOKENS + "x_cuts_at_words__mutmut_3", WHOLE, '... == "BertPreTokenizer" or type(backend.normalizer) ...'),
]
HUB = TS_MODEL + "test_the_hub_is_asked_only_online_and_only_for_a_name_that_is_no_directory"
SHARED = TS_MODEL + "test_one_model_encodes_both_sides_by_default"
INIT = SVDR_ENC + "xǁSparseEncoderǁ__init____mutmut_"
KILLED_BY += [
    (INIT + "1", SHARED, "shared: bool = False"),
    (INIT + "34", SHARED, "self.passage = self.query if (shared) and False else ..."),
    (INIT + "4", HUB + "[1-False-True]", "local_only = None"),
    (INIT + "5", HUB + "[0-True-True]", 'os.environ.get("HF_HUB_OFFLINE", "0") == "1" and Path(path).exists()'),
    (INIT + "8", HUB + "[1-False-True]", 'os.environ.get("0") == "1"'),
    (INIT + "10", HUB + "[1-False-True]", 'os.environ.get("XXHF_HUB_OFFLINEXX", "0")'),
    (INIT + "11", HUB + "[1-False-True]", 'os.environ.get("hf_hub_offline", "0")'),
    (INIT + "13", HUB + "[0-False-False]", 'os.environ.get("HF_HUB_OFFLINE", "0") != "1"'),
    (INIT + "14", HUB + "[1-False-True]", '... == "XX1XX"'),
    (INIT + "15", HUB + "[0-False-False]", "Path(None).exists()"),
    (INIT + "18", HUB + "[1-False-True]", "AutoTokenizer.from_pretrained(path, local_files_only=None)"),
    (INIT + "20", HUB + "[1-False-True]", "AutoTokenizer.from_pretrained(path, )"),
    (INIT + "27", HUB + "[1-False-True]", "AutoModel.from_pretrained(path, local_files_only=None)"),
    (INIT + "29", HUB + "[1-False-True]", "AutoModel.from_pretrained(path, )"),
]
PASSAGE_HUB = TS_MODEL + "test_a_separate_passage_side_is_not_downloaded_either"
SAVED_SHARED = TS_MODEL + "test_a_saved_shared_encoder_is_one_model_again_with_its_layernorm"
NO_DIMENSION = TS_MODEL + "test_a_vocab_start_must_leave_a_dimension"
KILLED_BY += [
    (INIT + "41", PASSAGE_HUB, "AutoModel.from_pretrained(passage_path ... else path, local_files_only=None)"),
    (INIT + "43", PASSAGE_HUB, "AutoModel.from_pretrained(passage_path ... else path, )"),
    (INIT + "61", SAVED_SHARED, 'self.passage.norm.load_state_dict(state.get("passage", None))'),
    (INIT + "63", SAVED_SHARED, 'self.passage.norm.load_state_dict(state.get("passage", ))'),
    (INIT + "72", NO_DIMENSION, "if self.vocab_size < 0:"),
    (INIT + "73", NO_DIMENSION, "if self.vocab_size <= 1:"),
    (INIT + "74", NO_DIMENSION, "raise ValueError(None)"),
    (INIT + "75", NO_DIMENSION, "... of a {vocab_start - self.vocab_size}-token vocabulary"),
]
DEFAULT_SIDE = TS_MODEL + "test_the_default_side_is_the_query_side"
CUT = TS_MODEL + "test_encode_cuts_texts_at_max_length_tokens"
KILLED_BY += [
    (SVDR_ENC + "xǁSparseEncoderǁforward__mutmut_1", DEFAULT_SIDE, 'side: str = "XXqueryXX"'),
    (SVDR_ENC + "xǁSparseEncoderǁforward__mutmut_2", DEFAULT_SIDE, 'side: str = "QUERY"'),
    *[(SVDR_ENC + f"xǁSparseEncoderǁtokenize__mutmut_{n}", CUT, f"self.tokenizer(texts, {change})") for n, change in (
        (4, "padding=True, truncation=None, max_length=max_length, ..."),
        (5, "padding=True, truncation=True, max_length=None, ..."),
        (9, "padding=True, max_length=max_length, ..."), (10, "padding=True, truncation=True, return_tensors=\"pt\""),
        (13, "padding=True, truncation=False, max_length=max_length, ..."))],
]
