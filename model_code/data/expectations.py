"""great-expectations suite over the accepted corpus: dataset-level quality, not row validity.

pandera (``validation.py``) decides which rows are usable; this suite judges whether the corpus
as a whole looks healthy (duplicate-text rate, text-length bounds, empty fields). Results are
saved as JSON and rendered as GX data docs (HTML) for people to browse.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pandas as pd

from model_code.config import DataParams


def _suite(gx, params: DataParams):
    expect = gx.expectations
    return [
        expect.ExpectColumnValuesToNotBeNull(column="doc_id"),
        expect.ExpectColumnValuesToNotBeNull(column="text"),
        expect.ExpectColumnValueLengthsToBeBetween(
            column="text", min_value=params.min_text_chars, max_value=params.max_text_chars
        ),
        expect.ExpectColumnValueLengthsToBeBetween(column="doc_id", min_value=1),
        expect.ExpectColumnProportionOfUniqueValuesToBeBetween(
            column="text", min_value=1.0 - params.max_duplicate_text_rate, max_value=1.0
        ),
    ]


def run_expectations(corpus: pd.DataFrame, params: DataParams, out_dir: Path) -> dict:
    """Validate ``corpus``; write ``expectations.json`` and ``data_docs/`` into ``out_dir``.

    Returns a summary: overall success and, per expectation, its type, column, success and
    observed value.
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    import great_expectations as gx

    context = gx.get_context(mode="ephemeral")
    docs_dir = out_dir / "data_docs"
    context.add_data_docs_site(
        site_name="corpus",
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    source = context.data_sources.add_pandas("ingest")
    batch_definition = source.add_dataframe_asset("corpus").add_batch_definition_whole_dataframe("corpus")
    suite = context.suites.add(gx.ExpectationSuite(name="corpus_quality", expectations=_suite(gx, params)))
    validation = context.validation_definitions.add(
        gx.ValidationDefinition(name="corpus_quality", data=batch_definition, suite=suite)
    )
    checkpoint = context.checkpoints.add(
        gx.Checkpoint(
            name="corpus_quality",
            validation_definitions=[validation],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="docs", site_names=["corpus"])],
        )
    )
    frame = corpus[["doc_id", "title", "text"]].copy()
    result = checkpoint.run(batch_parameters={"dataframe": frame})
    (validation_result,) = result.run_results.values()
    described = validation_result.describe_dict()
    (out_dir / "expectations.json").write_text(json.dumps(described, indent=2, default=str))
    if not (docs_dir / "index.html").exists():
        shutil.rmtree(docs_dir, ignore_errors=True)
        raise RuntimeError("great-expectations did not render data docs")
    return {
        "success": bool(described["success"]),
        "expectations": [
            {
                "type": item["expectation_type"],
                "column": item.get("kwargs", {}).get("column"),
                "success": item["success"],
                "observed": item.get("result", {}).get("observed_value"),
            }
            for item in described["expectations"]
        ],
    }
