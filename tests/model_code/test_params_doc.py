
import yaml
from pydantic import BaseModel, Field

from model_code.params_doc import COMMAND, render, settings, undocumented
from tests.conftest import REPOSITORY

ROOT = REPOSITORY


def test_every_setting_has_a_description():
    missing = undocumented()
    assert not missing, "settings without a description (add Field(..., description=...)): " + ", ".join(missing)


def _yaml_leaves(node, prefix=""):
    """Dotted paths of the leaf values of a parsed YAML mapping (lists are leaves)."""
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _yaml_leaves(value, f"{path}.")
        else:
            yield path


def test_every_key_of_the_shipped_params_file_is_documented():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    documented = {key: s for key, s in settings().items() if s.section is None}
    rendered, problems = render(), []
    for leaf in _yaml_leaves(raw):
        parts = leaf.split(".")
        # a mapping-valued setting (data.split_fractions) is documented as a whole
        owner = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in documented), None)
        if owner is None:
            problems.append(f"{leaf}: not in the reference")
        elif not (documented[owner].description or "").strip():
            problems.append(f"{leaf}: {owner} has no description")
        elif f"| `{owner}` |" not in rendered:
            problems.append(f"{leaf}: {owner} missing from the rendered reference")
    assert not problems, "params.yaml keys without documentation:\n" + "\n".join(problems)


def test_docs_params_md_is_up_to_date():
    path = ROOT / "docs" / "params.md"
    assert path.is_file() and path.read_text() == render(), f"docs/params.md is stale: regenerate with `{COMMAND}`"


class _Inner(BaseModel):
    """A nested section."""

    documented: int = Field(1, description="has one")
    bare: int = 2


class _Bare(BaseModel):
    x: int = Field(0, description="has one")


class _Outer(BaseModel):
    name: str = Field("a", description="has one")
    added: float = 0.5
    inner: _Inner = _Inner()
    bare_section: _Bare = _Bare()  # neither a field description nor a docstring
    described_section: _Bare = Field(_Bare(), description="the field's description documents the section")


def test_a_field_added_without_description_is_reported():
    assert undocumented(_Outer) == ["added", "bare_section", "inner.bare"]
    assert undocumented(_Inner) == ["bare"]


def test_reference_lists_defaults_and_shipped_values():
    text = render()
    # a default the shipped params.yaml overrides (encoder.max_passage_length: the model's own limit -> 64)
    assert "| `encoder.max_passage_length` | int or null, ≥ 1 | `null` | `64` |" in text
    # a value the shipped file leaves at its default shows no params.yaml value
    assert "| `train.max_steps` | int, ≥ 1 | `40` |  |" in text
    # every registered kind with settings has its own section
    assert "## `retriever.bm25`" in text and "## `retriever.incdsi`" in text
