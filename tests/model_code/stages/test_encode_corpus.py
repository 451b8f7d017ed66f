"""The encode-corpus stage (``model_code/stages/encode_corpus.py``): the corpus encoded in shards,
then merged by the index stage, equals the single-pass index; a shard run killed (-9) half-way
is resumed re-encoding only what it had not finished and no finished shard; the CLI, Dagster's
partitions and ``dvc.yaml`` run the same shards."""

import json
import subprocess
import sys

import dagster as dg
import numpy as np
import pytest
import yaml

from model_code.data.ingested import load_ingested
from model_code.models.encoder import Encoder
from model_code.retrievers import load_retriever
from model_code.stages.encode_corpus import shard_bounds
from tests.conftest import REPOSITORY, cli, run_stages, tiny_params

QUERIES = ["stars planets galaxies", "recipe oven flour", "stocks bonds interest", "football goal league"]


def counting_encodes(monkeypatch) -> list[str]:
    """Every passage text the encoder encodes from now on, in this process."""
    encoded: list[str] = []
    original = Encoder.encode

    def counting(self, texts, *args, side="passage", **kwargs):
        if side == "passage":
            encoded.extend(texts)
        return original(self, texts, *args, side=side, **kwargs)

    monkeypatch.setattr(Encoder, "encode", counting)
    return encoded


def test_shards_cover_the_corpus_once_in_contiguous_near_equal_parts():
    assert shard_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_bounds(2, 4) == [(0, 0), (0, 1), (1, 1), (1, 2)]
    for documents, shards in ((48, 5), (1000, 7), (3, 3)):
        bounds = shard_bounds(documents, shards)
        assert [start for start, _ in bounds[1:]] == [end for _, end in bounds[:-1]]
        assert bounds[0][0] == 0 and bounds[-1][1] == documents
        assert max(e - s for s, e in bounds) - min(e - s for s, e in bounds) <= 1


@pytest.mark.parametrize("kind", ["dense", "mlr"])
def test_a_sharded_encoding_merged_by_the_index_stage_equals_the_single_pass_index(tmp_path, beir_dir,
                                                                                   tiny_model_dir, monkeypatch, kind):
    """Two shards run one by one from the CLI, then the index stage: it encodes nothing, and its
    index holds the single-pass index's vectors (to float rounding: shards batch other texts
    together) and answers with the same top 10."""
    single = run_stages(tmp_path / "single", tiny_params(beir_dir, tiny_model_dir, train={"enabled": False},
                                                           retriever={"kind": kind}),
                        "ingest", "querygen", "train", "index")
    sharded = run_stages(tmp_path / "sharded", tiny_params(beir_dir, tiny_model_dir, train={"enabled": False},
                                                             retriever={"kind": kind}, data={"shards": 2}),
                         "ingest", "querygen", "train")
    encoded = counting_encodes(monkeypatch)
    assert cli(sharded.root, "encode-corpus", "--shard", "1/2") == 0
    assert cli(sharded.root, "encode-corpus", "--shard", "0/2") == 0
    corpus = load_ingested(sharded.ingested).passages()
    assert sorted(encoded) == sorted(corpus)  # each document once, over the two shards
    reports = [json.loads((sharded.shard_reports / f"{i}.json").read_text()) for i in (0, 1)]
    assert [(r["first_row"], r["documents"]) for r in reports] == [(0, 24), (24, 24)]

    encoded.clear()
    run_stages(sharded.root, None, "index")
    assert encoded == []  # the merge read every vector from the cache
    one, merged = (load_retriever(layout.retriever, layout.encoder) for layout in (single, sharded))
    ids = one.index.live_ids()
    assert merged.index.live_ids() == ids
    np.testing.assert_allclose(merged.index.vectors(ids), one.index.vectors(ids), atol=1e-5)
    assert [h.doc_ids for h in merged.search(QUERIES, 10)] == [h.doc_ids for h in one.search(QUERIES, 10)]


KILLED_IN_SHARD = """
import os, signal, sys
import model_code.models.embedding_cache as cache
from model_code.cli import main
from model_code.models.encoder import Encoder

cache.WRITE_EVERY = 4  # a chunk on disk every 4 texts
original, calls = Encoder.encode, []

def encode(self, texts, *args, **kwargs):
    calls.append(len(texts))
    if len(calls) == 3:  # two chunks of the shard written: killed in the third
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, texts, *args, **kwargs)

Encoder.encode = encode
sys.exit(main(["encode-corpus", "--shard", "1/3", "--params", sys.argv[1] + "/params.yaml", "--root", sys.argv[1]]))
"""


def test_a_shard_killed_half_way_resumes_with_what_it_had_not_finished(tmp_path, beir_dir, tiny_model_dir,
                                                                       monkeypatch):
    """Shard 0 of 3 finished; shard 1 killed (-9) after writing two chunks of four texts. Running
    every shard again encodes the rest of shard 1 and shard 2: nothing of shard 0, nothing of the
    eight texts shard 1 had written."""
    layout = run_stages(tmp_path / "ws", tiny_params(beir_dir, tiny_model_dir, train={"enabled": False},
                                                       data={"shards": 3}), "ingest", "querygen", "train")
    assert cli(layout.root, "encode-corpus", "--shard", "0/3") == 0
    killed = subprocess.run([sys.executable, "-c", KILLED_IN_SHARD, str(layout.root)], cwd=REPOSITORY,
                            capture_output=True, text=True, check=False)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (layout.shard_reports / "1.json").exists()

    encoded = counting_encodes(monkeypatch)
    assert cli(layout.root, "encode-corpus") == 0  # every shard in turn
    corpus = load_ingested(layout.ingested).passages()
    (_, _), (start, end), (_, last) = shard_bounds(len(corpus), 3)
    shard_one = corpus[start:end]
    assert len(encoded) == (end - start - 8) + (last - end)
    assert set(encoded) <= set(shard_one) | set(corpus[end:]) and set(corpus[end:]) <= set(encoded)
    assert sorted(json.loads(p.read_text())["shard"] for p in layout.shard_reports.glob("*.json")) == [0, 1, 2]


def test_a_shard_of_another_count_or_of_an_unsharded_stage_is_refused(tmp_path, beir_dir, tiny_model_dir, capsys):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(beir_dir, tiny_model_dir, data={"shards": 2})))
    assert cli(root, "encode-corpus", "--shard", "0/3") == 2
    assert "--shard 0/3: data.shards is 2; regenerate dvc.yaml" in capsys.readouterr().err
    assert cli(root, "encode-corpus", "--shard", "2/2") == 2
    assert "i must be between 0 and 1" in capsys.readouterr().err
    assert cli(root, "index", "--shard", "0/2") == 2
    assert "--shard: index is not a sharded stage (encode-corpus is)" in capsys.readouterr().err


def test_mlr_layers_the_encoder_lacks_are_refused_before_any_shard_encodes(tmp_path, beir_dir, tiny_model_dir,
                                                                            monkeypatch, capsys):
    """The default layers (6, 4) on a 2-layer encoder: the index stage refused them, after every
    shard had encoded the whole corpus at those layers."""
    layout = run_stages(tmp_path / "ws", tiny_params(beir_dir, tiny_model_dir, train={"enabled": False}),
                        "ingest", "querygen", "train")
    (layout.root / "params.yaml").write_text(yaml.safe_dump(tiny_params(
        beir_dir, tiny_model_dir, train={"enabled": False}, retriever={"kind": "mlr", "mlr": {"layers": [6, 4]}})))
    encoded = counting_encodes(monkeypatch)
    assert cli(layout.root, "encode-corpus") == 2
    assert "retriever.mlr.layers starts with layer 6, but the encoder's last layer is 2" in capsys.readouterr().err
    assert encoded == [] and not layout.shard_reports.exists()


def test_each_dagster_partition_encodes_its_shard(tmp_path, beir_dir, tiny_model_dir):
    """The partitioned asset, materialised for one partition, runs that shard only."""
    from assets.pipeline import stage_asset
    from model_code.config import load_params
    from model_code.stages.pipeline import STAGES
    from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource

    layout = run_stages(tmp_path / "ws", tiny_params(beir_dir, tiny_model_dir, train={"enabled": False},
                                                       data={"shards": 3}), "ingest", "querygen", "train")
    [stage] = [stage for stage in STAGES if stage.sharded]
    asset = stage_asset(stage, load_params(layout.root / "params.yaml"))  # as the definitions load it there
    assert asset.partitions_def.get_partition_keys() == ["0", "1", "2"]
    resources = {"params": ParamsResource(path=str(layout.root / "params.yaml")),
                 "workspace": WorkspaceResource(root=str(layout.root)), "mlflow_store": MlflowResource()}
    with dg.instance_for_test() as instance:
        result = dg.materialize([asset], partition_key="2",
                                instance=instance, resources=resources)
    assert result.success
    assert [p.name for p in layout.shard_reports.glob("*.json")] == ["2.json"]
    assert json.loads((layout.shard_reports / "2.json").read_text())["first_row"] == 32


def test_a_partition_count_the_params_no_longer_have_is_refused_saying_to_reload(tmp_path, beir_dir, tiny_model_dir):
    """Definitions loaded without the workspace's params (say the code server cannot see the
    model's files) have one partition; the refusal said to regenerate dvc.yaml, a DVC remedy."""
    from assets.pipeline import stage_asset
    from model_code.stages.pipeline import STAGES
    from orchestration.resources import MlflowResource, ParamsResource, WorkspaceResource

    layout = run_stages(tmp_path / "ws", tiny_params(beir_dir, tiny_model_dir, train={"enabled": False},
                                                       data={"shards": 3}), "ingest")
    [stage] = [stage for stage in STAGES if stage.sharded]
    asset = stage_asset(stage, None)
    resources = {"params": ParamsResource(path=str(layout.root / "params.yaml")),
                 "workspace": WorkspaceResource(root=str(layout.root)), "mlflow_store": MlflowResource()}
    with dg.instance_for_test() as instance, pytest.raises(ValueError, match=r"--shard 0/1: data.shards is 3; "
                                                           r"the partitions come from .* reload the definitions"):
        dg.materialize([asset], partition_key="0", instance=instance, resources=resources)
    assert not layout.shard_reports.exists()


@pytest.mark.parametrize("shards", [1, 3])
def test_dvc_yaml_lists_one_stage_per_shard_and_the_index_waits_for_each(monkeypatch, shards):
    """The project's params.yaml has one shard; three, as params.yaml with ``data.shards: 3``
    makes them, shows the count is followed."""
    from model_code.stages import pipeline
    from model_code.stages.pipeline import dvc_stages

    monkeypatch.setattr(pipeline, "shard_count", lambda: shards)
    stages = dvc_stages()["stages"]
    encode = stages["encode-corpus"]
    assert encode["foreach"] == list(range(shards))
    assert encode["do"]["cmd"] == f"fresh-retriever encode-corpus --shard ${{item}}/{shards}"
    assert encode["do"]["outs"] == [{"reports/shards/${item}.json": {"cache": False}}]
    assert [d for d in stages["index"]["deps"] if d.startswith("reports/shards")] == [
        f"reports/shards/{i}.json" for i in range(shards)]
