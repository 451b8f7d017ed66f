"""Command line for the MLflow side: ``fresh-registry register`` (the DVC registration stage),
``fresh-registry search "query"`` (queries the champion pyfunc locally),
``fresh-registry rollback [--to N] [--requeue]`` (moves the champion alias back, excluding or
re-queueing the batches it reverts), ``fresh-registry exclude-batches ID...`` (takes accepted
batches the champion does not serve out of the loop), ``fresh-registry serve [--version N]``
(the champion over HTTP, following ``serve.follow``) and
``fresh-registry log-updates`` (logs the versions written by ``fresh-retriever add-documents``) and
``fresh-registry gc [--apply]`` (Milvus collections and write-sets no version refers to)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import mlflow
from mlflow.exceptions import MlflowException

from model_code.config import load_params
from model_code.layout import Layout
from orchestration.signals import default_stop_signals
from tracking.following import FOLLOW_ENV, MODEL_ENV, REFRESH_ENV
from tracking.store import configure

# Each command imports what only it needs (the model code, torch): ``serve`` starts the server
# without them, in about 2 s instead of 5.


def _register(args, params, layout: Layout) -> int:
    from tracking.registry import run

    result = run(params, layout)
    print(json.dumps(result, indent=2, default=str))
    return 0


def _search(args, params, layout: Layout) -> int:
    """The query through the champion as a server following it answers (its version extended by
    the updates committed since), or through ``--model`` as registered."""
    import mlflow.pyfunc

    configure(layout.root, params.registry.experiment)
    name = params.registry.model_name
    if args.model:
        model = mlflow.pyfunc.load_model(args.model)
    else:
        os.environ[MODEL_ENV] = name  # the loaded model looks up which version it is: the lineage its commits extend
        model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
        model.unwrap_python_model().catch_up(name, "champion")
    result = model.predict(args.query, params={"k": args.k, "return": "documents" if args.documents else "ids"})
    version = result["model_version"][0]
    print(f"answered by {args.model or f'{name}@champion'}" + (f", version {version}" if version else ""))
    for position, (query, doc_ids, scores) in enumerate(zip(result["query"], result["doc_ids"], result["scores"])):
        print(f"query: {query}")
        for rank, (doc_id, score) in enumerate(zip(doc_ids, scores), start=1):
            print(f"  {rank:>3}. {score:.4f}  {doc_id}")
            if args.documents:
                document = result["documents"][position][rank - 1]
                print(f"       {document['title']}: {document['text'][:160]}")
    return 0


def _rollback(args, params, layout: Layout) -> int:
    from model_code.freshness.deployment import rollback
    from tracking.deployment import MlflowRegistry

    print(json.dumps(rollback(MlflowRegistry(params, layout), layout, args.to, args.requeue)))
    return 0


def _exclude(args, params, layout: Layout) -> int:
    from model_code.freshness.deployment import exclude_batches
    from tracking.deployment import MlflowRegistry

    records = exclude_batches(MlflowRegistry(params, layout), layout, args.batches, args.reason)
    print(json.dumps({"excluded": [r["batch_id"] for r in records], "reason": args.reason}))
    return 0


def _serve(args, params, layout: Layout) -> int:
    """``mlflow models serve`` of the champion (or ``--version N``), following ``serve.follow``."""
    configure(layout.root, params.registry.experiment)  # the tracking URI the server reads the registry from
    name, alias = params.registry.model_name, None if args.version else params.serve.follow
    uri = f"models:/{name}/{args.version}" if args.version else f"models:/{name}@{alias or 'champion'}"
    bin_dir = os.path.dirname(sys.executable)  # mlflow starts uvicorn from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri(), MODEL_ENV: name,
           REFRESH_ENV: str(params.serve.refresh_seconds), "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    env.pop(FOLLOW_ENV, None)
    if alias:
        env[FOLLOW_ENV] = alias
    command = [os.path.join(bin_dir, "mlflow"), "models", "serve", "-m", uri, "--env-manager", "local",
               "-h", args.host, "-p", str(args.port), "-w", str(args.workers)]
    print(f"serving {uri}" + (f", following @{alias} every {params.serve.refresh_seconds:g} s" if alias else " (pinned)"),
          file=sys.stderr, flush=True)
    exec_stoppable(command, env)


def exec_stoppable(command: list[str], env: dict[str, str]) -> None:
    """Become ``command`` with the stop signals at their defaults (``orchestration.signals``)."""
    default_stop_signals()
    os.execve(command[0], command, env)


def _gc(args, params, layout: Layout) -> int:
    from tracking.collections import collect_garbage

    configure(layout.root, params.registry.experiment)
    print(json.dumps(collect_garbage(params, layout, args.grace_hours * 3600, args.apply), indent=2))
    return 0


def _log_updates(args, params, layout: Layout) -> int:
    from tracking.deployment import log_updates

    print(json.dumps({"logged": log_updates(params, layout)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fresh-registry", description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--root", default=".", help="workspace root (default: current directory)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("register", help="log the pipeline's outputs to MLflow and register the retriever")
    search = sub.add_parser("search", help="search with the registered champion (or --model URI)")
    search.add_argument("query", nargs="+", help="one or more query strings")
    search.add_argument("-k", type=int, default=10)
    search.add_argument("--model", help="model URI (default models:/<registry.model_name>@champion)")
    search.add_argument("--documents", action="store_true", help="print each hit's title and text too")
    back = sub.add_parser("rollback", help="move the champion alias back to the version it replaced (or --to N); "
                          "the batches it reverts are excluded from later updates and retrains (or --requeue)")
    back.add_argument("--to", type=int, help="registered version to make champion")
    back.add_argument("--requeue", action="store_true",
                      help="apply the reverted batches again to the new champion instead of excluding them")
    exclude = sub.add_parser("exclude-batches", help="take accepted batches the champion does not serve out of the "
                             "loop: never applied, left out of retrains (a served batch: rollback)")
    exclude.add_argument("batches", nargs="+", help="batch ids (inbox/ledger.jsonl)")
    exclude.add_argument("--reason", default="excluded by hand", help="recorded in inbox/reverted.jsonl")
    serve = sub.add_parser("serve", help="serve the champion over HTTP, following serve.follow (each new version "
                           "it points at is served without a restart), or --version N, pinned")
    serve.add_argument("--version", type=int, help="serve this registered version and stay on it")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=5001)
    serve.add_argument("--workers", type=int, default=1, help="server worker processes (each follows on its own)")
    sub.add_parser("log-updates", help="log versions written by fresh-retriever add/edit/remove-documents")
    gc = sub.add_parser("gc", help="index.backend milvus: list (or --apply: drop) the collections, and the rows of "
                        "write-sets, that no registered version and no version in the workspace refers to, "
                        "and trim the commit rows no server needs any more")
    gc.add_argument("--apply", action="store_true", help="drop them (default: only list what would go)")
    gc.add_argument("--grace-hours", type=float, default=24.0,
                    help="leave anything younger alone: a training or an update may not be registered yet")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler = {"register": _register, "search": _search, "rollback": _rollback, "exclude-batches": _exclude,
               "serve": _serve, "log-updates": _log_updates, "gc": _gc}[args.command]
    try:
        return handler(args, load_params(args.params), Layout(args.root))
    except Exception as exc:
        from model_code.stores.milvus_store import MilvusStoreError  # imported here: it is needed only then

        # no champion, a bad params file, bad input, the tracking store or a Milvus server refusing: said, not a traceback
        if not isinstance(exc, FileNotFoundError | LookupError | ValueError | MlflowException | MilvusStoreError):
            raise
        print(f"fresh-registry {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
