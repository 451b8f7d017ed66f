"""Command line for the pipeline stages (what ``dvc.yaml`` runs): ``fresh-retriever <stage>``.

Each subcommand loads ``params.yaml``, resolves paths through ``Layout`` and calls the same stage
function the Dagster asset calls.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from model_code.config import load_data_params, load_params
from model_code.data.tables import IngestError
from model_code.layout import Layout
from model_code.stages.pipeline import STAGES

# Commands import what they use when they run: torch and transformers take seconds to import, and a
# stage that needs neither (ingest, every stage DVC runs for a kind that skips it) should not wait.
PIPELINE = {stage.name: stage for stage in STAGES if stage.command == "fresh-retriever"}
UPDATE_COMMANDS = ("add-documents", "edit-documents", "remove-documents")


def _update(argv: list[str]) -> int:
    """``add-documents FILE...`` / ``edit-documents FILE...`` / ``remove-documents ID...``: each a
    new, versioned retriever version."""
    from model_code.versions.apply import add_documents, edit_documents, remove_documents

    parser = argparse.ArgumentParser(prog=f"fresh-retriever {argv[0]}")
    parser.add_argument("targets", nargs="+", help="batch file (.jsonl/.parquet) or document ids")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--root", default=".")
    args = parser.parse_args(argv[1:])
    layout = Layout(args.root)
    try:
        params = load_params(args.params)
        if argv[0] == "remove-documents":
            _print_update(remove_documents(layout, params, args.targets), layout)
        else:
            apply = add_documents if argv[0] == "add-documents" else edit_documents
            for target in args.targets:  # each printed once applied: a later file's error leaves it applied
                _print_update(apply(layout, params, Path(target)), layout)
    except (IngestError, OSError, KeyError, ValueError) as exc:
        print(f"fresh-retriever {argv[0]}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _print_update(result: dict, layout: Layout) -> None:
    """The update's summary (stdout), then each row it rejected (stderr), as ``submit-documents`` prints them."""
    from model_code.data.batches import describe_reject
    from model_code.versions.chain import RetrieverVersions

    print(json.dumps({k: v for k, v in result.items() if k not in ("doc_ids", "removed_ids")}, default=str), flush=True)
    if result.get("rejected"):
        rejects = RetrieverVersions(layout).version_dir(result["version"]) / "rejects.jsonl"
        for line in rejects.read_text().splitlines():
            print(f"  rejected {describe_reject(json.loads(line))}", file=sys.stderr)


def _submit(argv: list[str]) -> int:
    """``submit-documents FILE...``: validate each batch and place it in the inbox atomically."""
    from model_code.data.batches import describe_reject
    from model_code.freshness.inbox import Inbox

    parser = argparse.ArgumentParser(prog="fresh-retriever submit-documents",
                                     description="Validate document batches and drop them into the inbox.")
    parser.add_argument("files", nargs="+", type=Path, help="batch files (.jsonl BEIR corpus lines or .parquet)")
    parser.add_argument("--root", default=".", help="workspace root (the inbox is <root>/inbox)")
    parser.add_argument("--params", default="params.yaml", help="its data.* limits validate the documents")
    args = parser.parse_args(argv)
    try:
        inbox = Inbox(Layout(args.root).inbox, data=load_data_params(args.params))
    except (OSError, ValueError) as exc:
        print(f"fresh-retriever submit-documents: error: {exc}", file=sys.stderr)
        return 2
    status = 0
    for file in args.files:
        try:
            target, changes = inbox.submit(file)
        except (IngestError, OSError, ValueError) as exc:
            print(f"fresh-retriever submit-documents: error: {exc}", file=sys.stderr)
            status = 2
            continue
        print(f"submitted {file} -> {target}: {len(changes.documents)} documents, {len(changes.deleted)} deletions, "
              f"{len(changes.rejects)} rows rejected")
        for reject in changes.rejects:
            print(f"  rejected {describe_reject(reject)}", file=sys.stderr)
    return status


def _train_distributed(argv: list[str]) -> int:
    """``train-distributed``: this node's part of a training on ``train.distributed.nodes`` machines."""
    from model_code.training.launch import torchrun_command

    parser = argparse.ArgumentParser(prog="fresh-retriever train-distributed",
                                     description="Run on every node with the same params: the train stage under "
                                     "torchrun with train.distributed's rendezvous, nodes and processes per node.")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--root", default=".", help="workspace root, on a filesystem every node mounts")
    parser.add_argument("--print", action="store_true", help="print the torchrun command instead of running it")
    args = parser.parse_args(argv)
    try:
        command = torchrun_command(load_params(args.params), args.params, args.root)
    except (OSError, ValueError) as exc:
        print(f"fresh-retriever train-distributed: error: {exc}", file=sys.stderr)
        return 2
    if args.print:
        print(" ".join(command))
        return 0
    os.execv(command[0], command)


def _profile(argv: list[str]) -> int:
    """``profile [DATA]``: what the encoder's token lengths cut from a corpus (``data/profile.py``)."""
    from model_code.data.beir import read_beir
    from model_code.data.profile import describe, profile
    from model_code.stages.ingest import read_source

    parser = argparse.ArgumentParser(prog="fresh-retriever profile",
                                     description="Token lengths of a corpus's documents and queries in the encoder's "
                                     "tokens, and the share the configured and the model's own limits cut.")
    parser.add_argument("data", nargs="?", type=Path, help="a BEIR directory (default: the source params.data names)")
    parser.add_argument("--params", default="params.yaml", help="its encoder section names the model and lengths")
    parser.add_argument("--root", default=".", help="workspace root (data.path is relative to it)")
    parser.add_argument("--sample", type=int, default=10_000, help="texts profiled per side at most (0: all)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        params = load_params(args.params)
        raw = read_beir(args.data) if args.data else read_source(params.data, Path(args.root))[0]
        report = profile(raw, params.encoder, args.sample or None)
    except (IngestError, OSError, ValueError) as exc:
        print(f"fresh-retriever profile: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else describe(report))
    return 0


def describe_tree(path: Path) -> str:
    """Human-readable summary of a saved corpus tree (``fresh-retriever tree-info``)."""
    from model_code.hierarchy.tree import CorpusTree

    stats = CorpusTree.load(path).stats()
    histogram = ", ".join(f"{k}:{v}" for k, v in stats["fan_out_histogram"].items())
    return "\n".join(
        [
            f"tree: {path}",
            f"documents: {stats['documents']}   depth (incl. documents): {stats['depth']}",
            f"nodes per level: {stats['nodes_per_level']}",
            (f"leaf clusters: {stats['leaf_clusters']} (largest {stats['largest_leaf_cluster']}, "
             f"smallest {stats['smallest_leaf_cluster']} documents)"),
            f"fan-out histogram (children: nodes): {histogram}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] and argv[0] in UPDATE_COMMANDS:
        return _update(argv)
    if argv[:1] == ["submit-documents"]:
        return _submit(argv[1:])
    if argv[:1] == ["train-distributed"]:
        return _train_distributed(argv[1:])
    if argv[:1] == ["profile"]:
        return _profile(argv[1:])
    if argv[:1] == ["tree-info"]:
        tree = Path(argv[1]) if len(argv) > 1 else Layout(".").final_tree / "tree.npz"
        tree = tree if tree.suffix == ".npz" else tree / "tree.npz"
        if not tree.is_file():
            print(f"fresh-retriever tree-info: error: {tree}: no corpus tree (the cluster stage writes one)",
                  file=sys.stderr)
            return 2
        print(describe_tree(tree))
        return 0
    parser = argparse.ArgumentParser(
        prog="fresh-retriever",
        description=__doc__,
        epilog=("Also: fresh-retriever tree-info [TREE]; add-documents FILE...; edit-documents FILE...; "
                "remove-documents ID...; submit-documents FILE...; profile [DATA]; train-distributed"),
    )
    parser.add_argument("stage", choices=[*PIPELINE, "all"], help="stage to run ('all' runs them in order)")
    parser.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    parser.add_argument("--root", default=".", help="workspace root for outputs (default: current directory)")
    parser.add_argument("--shard", metavar="I/N", help="a sharded stage (encode-corpus): only shard I of N = data.shards "
                        "(default: every shard in turn)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        params = load_params(args.params)
        layout = Layout(args.root)
        if args.shard and not (args.stage in PIPELINE and PIPELINE[args.stage].sharded):
            raise ValueError(f"--shard: {args.stage} is not a sharded stage "
                             f"({', '.join(name for name, stage in PIPELINE.items() if stage.sharded)} is)")
        for name in PIPELINE if args.stage == "all" else [args.stage]:
            # imported here: it imports the kinds, and with them torch, which submit-documents must not
            from model_code.stages.encode_corpus import parse_shard

            shard = {"shard": parse_shard(args.shard, params)} if args.shard else {}
            result = PIPELINE[name].runner()(params, layout, **shard)
            print(json.dumps({"stage": name, **{k: v for k, v in result.items() if not isinstance(v, list)}},
                             default=str))
    except (IngestError, OSError, ValueError) as exc:
        print(f"fresh-retriever {args.stage}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
