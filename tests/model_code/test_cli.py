"""The CLI (``model_code/cli.py``): the DVC-side entry points, every stage through the CLI on tiny
data, real code paths; and ``fresh-retriever submit-documents``, which checks documents against
``params.data`` alone: it starts in about a second because it imports no retriever kind (and no
torch), and a fault in the data section is still reported naming the file and key."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

from model_code.cli import main
from model_code.layout import Layout
from tests.conftest import REPOSITORY, run_stages


def test_all_stages_run_in_order_and_write_their_outputs(workspace, capsys):
    assert main(["all", "--params", str(workspace / "params.yaml"), "--root", str(workspace)]) == 0
    layout = Layout(workspace)
    assert len(pd.read_parquet(layout.pseudo_queries)) == 96  # 48 documents x 2 spans
    assert json.loads((layout.hierarchy / "stats.json").read_text())["documents"] == 48
    assert (layout.encoder / "config.json").exists() and (layout.encoder / "tokenizer.json").exists()
    train = json.loads((layout.train_report / "metrics.json").read_text())
    assert train["steps"] == 3 and train["first_loss"] > 0
    steps = pd.read_csv(layout.train_report / "steps.csv")
    assert list(steps["step"]) == [1, 2, 3] and {"loss", "lr", "joint"} <= set(steps.columns)
    manifest = json.loads((layout.retriever / "manifest.json").read_text())
    assert (manifest["kind"], manifest["documents"], manifest["factory"]) == ("dense", 48, "Flat")
    metrics = json.loads((layout.eval_report / "metrics.json").read_text())
    assert metrics["queries"] == 12 and 0.0 <= metrics["ndcg@10"] <= 1.0
    run_lines = (layout.eval_report / "run.trec").read_text().splitlines()
    assert len(run_lines) == 12 * 10 and run_lines[0].split()[1] == "Q0"
    assert (layout.eval_report / "metrics.png").stat().st_size > 1000
    assert "ndcg@10" in capsys.readouterr().out


def test_zero_shot_keeps_the_loaded_encoder(workspace, tiny_model_dir):
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["train"]["enabled"] = False
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--params", str(workspace / "params.yaml"), "--root", str(workspace)]
    assert main(["ingest", *args]) == 0 and main(["train", *args]) == 0
    saved = Layout(workspace).encoder / "model.safetensors"
    assert saved.read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()


def test_cli_reports_bad_input_as_an_error(workspace, capsys):
    (workspace / "params.yaml").write_text("data:\n  source: beir\n  path: /does/not/exist\n")
    assert main(["ingest", "--params", str(workspace / "params.yaml"), "--root", str(workspace)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_trained_encoder_loads_in_sentence_transformers(workspace):
    """Users can take the model out of the project: sentence-transformers embeds as our encoder does."""
    from sentence_transformers import SentenceTransformer

    from model_code.models.encoder import Encoder

    run_stages(workspace, None, "ingest", "querygen", "train")  # 3 contrastive steps
    directory = Layout(workspace).encoder
    texts = ["a comet crossed the nebula", "simmer the spice with butter and flour, then bake the dough"]
    ours = Encoder(str(directory), "mean").encode(texts, max_length=32)
    theirs = SentenceTransformer(str(directory), device="cpu").encode(texts, convert_to_numpy=True)
    assert theirs.shape == ours.shape
    assert abs(theirs - ours).max() < 1e-5


_SUBMIT_AND_LIST_MODULES = """
import json, sys
from model_code.cli import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "modules": sorted(sys.modules)}))
"""


def _submit(tmp_path: Path, params: str, *documents: dict) -> tuple[dict, str]:
    (tmp_path / "params.yaml").write_text(params)
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(d) + "\n" for d in documents))
    done = subprocess.run([sys.executable, "-c", _SUBMIT_AND_LIST_MODULES, "submit-documents", str(batch),
                           "--root", str(tmp_path), "--params", str(tmp_path / "params.yaml")],
                          cwd=REPOSITORY, capture_output=True, text=True, check=True)
    *printed, modules = done.stdout.splitlines()
    return {**json.loads(modules), "printed": printed}, done.stderr


def test_submit_applies_the_data_limits_without_importing_a_retriever_kind(tmp_path):
    result, stderr = _submit(tmp_path, "data: {min_text_chars: 10}\nretriever: {kind: dense}\n",
                             {"_id": "long", "title": "", "text": "long enough text"},
                             {"_id": "short", "title": "", "text": "tiny"})
    assert result["status"] == 0
    assert len(list((tmp_path / "inbox").glob("batch*.jsonl"))) == 1  # the receiving run rejects the row again
    assert "1 documents, 0 deletions, 1 rows rejected" in result["printed"][0]
    assert "batch.jsonl:2: text:" in stderr  # the rejected row, by file, line and field
    assert "torch" not in result["modules"] and "model_code.retrievers" not in result["modules"]


def test_a_bad_data_section_is_named_and_nothing_is_submitted(tmp_path):
    result, stderr = _submit(tmp_path, "data: {min_text_chars: 0}\n", {"_id": "a", "title": "", "text": "text"})
    assert result["status"] == 2
    assert "params.yaml" in stderr and "data.min_text_chars" in stderr
    assert not list((tmp_path / "inbox").glob("*.jsonl"))


def test_a_split_the_data_lacks_and_a_missing_tree_are_errors_not_tracebacks(workspace, capsys):
    """Before: training on qrels the data has not (many BEIR sets ship test qrels only) raised a
    KeyError through every command; ``tree-info`` before the cluster stage raised FileNotFoundError."""
    from model_code.data.ingested import load_ingested

    params = yaml.safe_load((workspace / "params.yaml").read_text())
    (Path(params["data"]["path"]) / "qrels" / "train.tsv").unlink()
    params["train"]["data"] = "supervised"
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--params", str(workspace / "params.yaml"), "--root", str(workspace)]
    assert main(["ingest", *args]) == 0
    assert sorted(load_ingested(Layout(workspace).ingested).qrels) == ["test"]
    assert main(["train", *args]) == 2
    assert ("fresh-retriever train: error: the ingested data has no 'train' qrels (it has test): add "
            "qrels/train.tsv to the data") in capsys.readouterr().err
    assert main(["tree-info", str(workspace / "models" / "nowhere")]) == 2
    assert "nowhere/tree.npz: no corpus tree (the cluster stage writes one)" in capsys.readouterr().err


def test_add_documents_prints_each_file_once_applied_so_a_later_error_leaves_no_doubt(workspace, capsys):
    run_stages(workspace, None, "ingest", "querygen", "train", "index")
    good, bad = workspace / "good.jsonl", workspace / "bad.jsonl"
    good.write_text(json.dumps({"_id": "new-1", "title": "", "text": "a comet crossed the nebula"}) + "\n"
                    + json.dumps({"_id": "new-2", "title": "", "text": ""}) + "\n")  # a row rejected, named below
    bad.write_text("{not json\n")
    args = ["--params", str(workspace / "params.yaml"), "--root", str(workspace)]
    capsys.readouterr()  # what the stages printed
    assert main(["add-documents", str(good), str(bad), *args]) == 2
    out, err = capsys.readouterr()
    [applied] = [json.loads(line) for line in out.splitlines()]
    assert (applied["operation"], applied["added"], applied["rejected"]) == ("add", 1, 1)
    assert "  rejected good.jsonl:2: " in err and "bad.jsonl:1: malformed JSON" in err
