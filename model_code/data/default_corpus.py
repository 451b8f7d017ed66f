"""The built-in corpus: Python docstrings as a CodeSearchNet-style retrieval task.

Every installation has the standard library's source, so the pipeline can run offline on real
(not synthetic) text with no data supplied. Sources are parsed with ``ast`` (never imported, so
no module side effects). For each documented function, method or class:

* the query is the docstring's summary paragraph;
* the document is the qualified name, the signature and the rest of the docstring.

Summaries shared by several definitions ("Return self==value.") are dropped because such a query
has no single answer. The result is deterministic for a given set of installed sources.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import sysconfig
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from model_code.config import DefaultCorpusParams
from model_code.data.tables import RawDataset

_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages", "__pycache__"}


@dataclass(frozen=True)
class DocEntry:
    qualname: str
    signature: str
    summary: str
    body: str
    source: str
    line: int


def source_roots(packages: list[str]) -> list[Path]:
    """Directories to read: the standard library plus named installed packages (not imported)."""
    roots = [Path(sysconfig.get_paths()["stdlib"])]
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"default corpus: package {name!r} is not installed")
        roots.extend(Path(p) for p in spec.submodule_search_locations)
    return roots


def iter_docstrings(root: Path, min_summary_words: int, min_body_words: int) -> Iterator[DocEntry]:
    """Yield documented definitions under ``root`` in a stable order."""
    base = root.parent if (root / "__init__.py").exists() else root  # packages keep their own name
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(base)
        if any(part in _SKIP_DIRS or part.startswith(".") for part in relative.parts[:-1]):
            continue
        module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        yield from _walk(tree, module, str(relative), min_summary_words, min_body_words)


def _walk(node: ast.AST, prefix: str, source: str, min_summary: int, min_body: int) -> Iterator[DocEntry]:
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if child.name.startswith("_") and child.name != "__init__":
            continue
        qualname = f"{prefix}.{child.name}"
        doc = ast.get_docstring(child)
        if doc:
            summary, _, body = inspect.cleandoc(doc).partition("\n\n")
            summary = _first_sentence(" ".join(summary.split()))
            body = body.strip()
            if len(summary.split()) >= min_summary and len(body.split()) >= min_body:
                signature = "" if isinstance(child, ast.ClassDef) else f"({ast.unparse(child.args)})"
                yield DocEntry(qualname, signature, summary, body, source, child.lineno)
        if isinstance(child, ast.ClassDef):
            yield from _walk(child, qualname, source, min_summary, min_body)


def _first_sentence(paragraph: str, max_words: int = 40) -> str:
    """Long summary paragraphs are cut to their first sentence: a query is a line, not an essay."""
    if len(paragraph.split()) <= max_words:
        return paragraph
    head, dot, _ = paragraph.partition(". ")
    return head + dot.strip() if dot else paragraph


def _stable_rank(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def build_default_corpus(params: DefaultCorpusParams) -> RawDataset:
    entries: dict[str, DocEntry] = {}
    for root in source_roots(params.packages):
        for entry in iter_docstrings(root, params.min_summary_words, params.min_body_words):
            entries.setdefault(entry.qualname, entry)  # first definition wins (e.g. if/else variants)
    summary_counts = Counter(e.summary.lower() for e in entries.values())
    unique = [e for e in entries.values() if summary_counts[e.summary.lower()] == 1]
    if len(unique) < params.max_documents:
        raise RuntimeError(
            f"only {len(unique)} documented definitions found, fewer than "
            f"default_corpus.max_documents={params.max_documents}; lower it or add packages"
        )
    chosen = sorted(unique, key=lambda e: _stable_rank(e.qualname))[: params.max_documents]
    chosen.sort(key=lambda e: e.qualname)
    corpus = pd.DataFrame(
        {
            "doc_id": [e.qualname for e in chosen],
            "title": [e.qualname for e in chosen],
            "text": [f"{e.qualname}{e.signature}\n{e.body}" for e in chosen],
            "source": [e.source for e in chosen],
            "line": [e.line for e in chosen],
        }
    )
    queries = pd.DataFrame(
        {
            "query_id": [f"q:{e.qualname}" for e in chosen],
            "text": [e.summary for e in chosen],
            "source": [e.source for e in chosen],
            "line": [e.line for e in chosen],
        }
    )
    is_test = [int(_stable_rank("test:" + e.qualname), 16) / 16**16 < params.test_fraction for e in chosen]
    qrels = pd.DataFrame(
        {
            "query_id": queries["query_id"],
            "doc_id": corpus["doc_id"],
            "relevance": 1,
            "source": "default-corpus",
            "line": range(1, len(chosen) + 1),
        }
    )
    mask = pd.Series(is_test)
    return RawDataset(
        corpus=corpus,
        queries=queries,
        qrels={"train": qrels[~mask].reset_index(drop=True), "test": qrels[mask].reset_index(drop=True)},
    )
