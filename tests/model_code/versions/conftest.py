import pytest

from model_code.cli import main


@pytest.fixture
def deployed(workspace):
    """A workspace where every stage ran: the base retriever that updates are versions of."""
    assert main(["all", "--params", str(workspace / "params.yaml"), "--root", str(workspace)]) == 0
    return workspace
