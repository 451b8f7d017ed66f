"""``fresh-retriever submit-documents`` checks documents against ``params.data`` alone: it starts
in about a second because it imports no retriever kind (and no torch), and a fault in the data
section is still reported naming the file and key."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]

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
                          cwd=REPO, capture_output=True, text=True, check=True)
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
