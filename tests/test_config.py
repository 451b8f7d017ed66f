from pathlib import Path

import pytest
import yaml

from model_code.config import Params, flatten, load_params

ROOT = Path(__file__).resolve().parents[1]


def test_project_params_file_is_valid_and_complete():
    params = load_params(ROOT / "params.yaml")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert set(raw) == set(Params.model_fields), "params.yaml should spell out every section"
    assert params.encoder.model == "minilm"


def test_unknown_key_is_rejected(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  max_stpes: 3\n")
    with pytest.raises(ValueError, match="max_stpes"):
        load_params(path)


def test_overrides_merge_into_sections(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  max_steps: 3\n  batch_size: 8\n")
    params = load_params(path, {"train": {"max_steps": 7}})
    assert (params.train.max_steps, params.train.batch_size) == (7, 8)
    assert flatten(params)["train.max_steps"] == 7


def test_non_default_source_needs_a_path(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("data:\n  source: beir\n")
    with pytest.raises(ValueError, match="data.path is required"):
        load_params(path)
