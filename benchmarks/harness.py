"""The command line the benchmark harnesses share: where the results go and the switch that lets
uncommitted code write them (``benchmarks.run.checked_commit``), every harness; a BEIR directory,
those that read one; and the named configurations, those that run several
(``benchmarks.shared_training``, ``benchmarks.index_cost``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.configs import CONFIGS

RESULTS = Path(__file__).resolve().parent / "results"


def results_arguments(parser: argparse.ArgumentParser) -> None:
    """``--out`` (default ``benchmarks/results``) and ``--allow-dirty``."""
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: benchmarks/results)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write into benchmarks/results/ from uncommitted code (the results are marked dirty)")


def configurations_parser(prog: str, description: str, configs_help: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, type=Path, help="BEIR directory")
    parser.add_argument("--configs", required=True, nargs="+", choices=CONFIGS, metavar="CONFIG", help=configs_help)
    results_arguments(parser)
    return parser


def beir_directory(parser: argparse.ArgumentParser, given: Path) -> Path:
    """``--data`` resolved, or a usage error when it holds no BEIR corpus."""
    data = given.resolve()
    if not (data / "corpus.jsonl").exists():
        parser.error(f"{given} is not a BEIR directory (no corpus.jsonl)")
    return data
