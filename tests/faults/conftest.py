"""The fault suites' deployment: a dense champion in a fresh MLflow store."""

import pytest

from model_code.config import load_params
from model_code.layout import Layout
from tests.helpers.deployment import deploy


@pytest.fixture
def deployed(tmp_path, tiny_model_dir):
    root, uri, _ = deploy(tmp_path, tiny_model_dir, "dense")
    return load_params(root / "params.yaml"), Layout(root), uri
