import re

import pytest
import yaml

from model_code.config import Params, flatten, load_params
from tests.conftest import REPOSITORY

ROOT = REPOSITORY


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


@pytest.mark.parametrize("text", ["", "# every setting commented out\n", "null\n"])
def test_a_file_without_parameters_is_refused_naming_it(tmp_path, text):
    """An empty file used to load as every default, so ingest read the built-in docstring corpus
    instead of the configured data; ``{}`` still asks for every default, explicitly."""
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: holds no parameters"):
        load_params(path)
    path.write_text("{}\n")
    assert load_params(path) == Params()


@pytest.mark.parametrize("text, kind", [("- data\n- train\n", "list"), ("3\n", "int"), ("just words\n", "str")])
def test_a_file_that_is_not_a_mapping_is_refused_naming_it(tmp_path, text, kind):
    """It used to fail inside the merge of overrides, with a message that named no file."""
    path = tmp_path / "params.yaml"
    path.write_text(text)
    message = rf"^{re.escape(str(path))}: parameters must be a mapping of sections \(data, .*\), got a {kind}$"
    with pytest.raises(ValueError, match=message):
        load_params(path)


@pytest.mark.parametrize("yaml_text, message", [
    ("data:\n  min_text_chars: 500\n  max_text_chars: 100\n",
     r"data\.min_text_chars \(500\) is above data\.max_text_chars \(100\)"),
    ("data:\n  path: corpus/\n",
     r"data\.path \('corpus/'\) is set but data\.source is 'default', which reads no path: set data\.source"),
    ("train:\n  method: hce\n  max_steps: 3\n  hce: {rounds: 5}\n",
     r"train\.hce\.rounds \(5\) is above train\.max_steps \(3\): each EM round needs at least one step"),
])
def test_contradicting_settings_are_refused_at_load_naming_the_file_and_keys(tmp_path, yaml_text, message):
    """Each pair used to load and fail (or silently do something else) later: no valid documents
    at ingest; the built-in corpus ingested instead of the data at data.path; HCE training more
    steps than train.max_steps, one per round."""
    path = tmp_path / "params.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: invalid parameters: {message}"):
        load_params(path)


def test_a_kind_whose_vectors_the_backend_cannot_keep_is_refused_at_load(tmp_path):
    """A backend with a dense store only (registered here) refuses svdr's sparse vectors when the
    params are read, not after training."""
    from model_code.stores import register_store, unregister_store
    from model_code.stores.faiss_store import FaissStore

    @register_store
    class DenseOnly(FaissStore):
        backend = "dense_only_test"

    path = tmp_path / "params.yaml"
    path.write_text("index:\n  backend: dense_only_test\nretriever:\n  kind: svdr\n")
    try:
        with pytest.raises(ValueError, match=r"retriever\.kind 'svdr' keeps sparse vectors: index\.backend "
                                             r"'dense_only_test' has no sparse store"):
            load_params(path)
        load_params(path, {"retriever": {"kind": "dense"}})
    finally:
        unregister_store("dense_only_test", "dense")


def test_a_retriever_kinds_setting_is_named_under_its_kind(tmp_path):
    """A kind's settings are validated inside retriever's check, where pydantic named a misspelt key
    retriever.k3, without the kind it belongs to."""
    path = tmp_path / "params.yaml"
    path.write_text("retriever:\n  bm25: {k3: 1}\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: invalid parameters: retriever\.bm25\.k3: Extra"):
        load_params(path)


def test_encoder_lengths_left_out_are_the_models_own_limit(tmp_path, tiny_model_dir):
    """The bundled MiniLM's sentence-transformers max_seq_length (256, in its files); a plain
    Hugging Face directory's position embeddings (the tiny BERT's 128); a set length stays."""
    from model_code.config import EncoderParams

    assert (EncoderParams().max_query_length, EncoderParams().max_passage_length) == (256, 256)
    tiny = EncoderParams(model=str(tiny_model_dir), max_query_length=20)
    assert (tiny.max_query_length, tiny.max_passage_length) == (20, 128)
    with pytest.raises(ValueError, match=r"encoder.model '.*nowhere': no sentence_bert_config.json or config.json"):
        EncoderParams(model=str(tmp_path / "nowhere"))


def test_a_roberta_like_models_limit_leaves_out_the_positions_before_its_padding_id(tmp_path, tiny_model_dir):
    """RoBERTa's position ids start after the padding id: its config's 514 positions read 512
    tokens. The default length was 514, and the first long passage failed inside the model. The
    limit is checked against the model itself: it reads the limit's tokens, and one more fails."""
    import shutil

    import torch
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    from model_code.config import EncoderParams, model_token_limit
    from model_code.models.encoder import Encoder

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = RobertaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=12, pad_token_id=1)
    directory = tmp_path / "tiny-roberta"
    RobertaModel(config).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, directory / name)
    assert model_token_limit(str(directory)) == (10, "config.json max_position_embeddings less the padding offset")
    params = EncoderParams(model=str(directory))
    assert (params.max_query_length, params.max_passage_length) == (10, 10)

    encoder = Encoder(str(directory), device=torch.device("cpu"))
    long_text = " ".join(["lava"] * 40)
    assert encoder.encode([long_text], max_length=10).shape[0] == 1
    with pytest.raises((IndexError, RuntimeError)):
        encoder.encode([long_text], max_length=11)


@pytest.mark.parametrize("yaml_text, message", [
    ("data: {}\ndata: {seed: 1}\n", r"not valid YAML: key 'data' is written twice"),  # YAML keeps the last, silently
    ("encoder: {model: 5}\n", r"encoder\.model: Input should be a valid string"),  # was a TypeError traceback
    ("encoder: {max_query_length: 0}\n", r"encoder\.max_query_length: Input should be greater than or equal to 1"),
    ("data: {split_fractions: {old: 1.2, new: -0.2, tune: 0}}\n", r"split_fractions must each be between 0 and 1"),
    ("data: {split_fractions: {old: .nan, new: 0.5, tune: 0.5}}\n", r"split_fractions must each be between 0 and 1"),
    # a metric deeper than the retrieval was measured on the hits there were and published under its name
    ("eval: {top_k: 10}\n", r"eval\.metrics 'recall@100' needs 100 documents per query, more than eval\.top_k \(10\)"),
    ("eval: {top_k: 10, metrics: [ndcg@10]}\nregistry: {metric: map@20}\n", r"registry\.metric 'map@20' needs 20"),
])
def test_a_wrong_value_is_refused_naming_the_file_and_key_never_replaced_or_dropped(tmp_path, yaml_text, message):
    path = tmp_path / "params.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: .*{message}"):
        load_params(path)


def test_a_params_path_that_cannot_be_read_is_an_error_naming_it(tmp_path):
    from model_code.config import load_data_params

    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path))}: cannot read the params file \(Is a directory\)"):
        load_params(tmp_path)
    (tmp_path / "params.yaml").write_text("data: null\n")  # as load_params refuses it, not read as every default
    with pytest.raises(ValueError, match=r"params\.yaml: invalid parameters"):
        load_data_params(tmp_path / "params.yaml")
