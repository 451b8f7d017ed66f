"""benchmarks/configs.py: configurations are YAML files that extend a base and name their seed count;
every configuration a committed result cites is still defined."""

import json

import pytest

from benchmarks import configs
from benchmarks.configs import CONFIG_DIR, PIPELINE_CONFIGS, config_files, config_names, config_overrides
from benchmarks.provenance import PROJECT


def write(directory, **files):
    directory.mkdir(exist_ok=True)
    for name, text in files.items():
        (directory / f"{name}.yaml").write_text(text)
    return directory


def test_a_configuration_is_its_bases_overrides_deep_merged_under_its_own(tmp_path):
    d = write(tmp_path, _common="encoder: {max_query_length: 64}\ntrain: {max_steps: 120, hce: {mode: J, rounds: 2}}\n",
              a="base: _common\nseeds: 3\ntrain: {hce: {rounds: 1}}\n",
              b="base: a\ntrain: {learning_rate: 3.0e-5}\n")
    assert config_overrides("b", d) == {"encoder": {"max_query_length": 64},
                                        "train": {"max_steps": 120, "hce": {"mode": "J", "rounds": 1},
                                                  "learning_rate": 3e-5}}
    assert config_files("b", d) == [d / "b.yaml", d / "a.yaml", d / "_common.yaml"]
    assert config_overrides("_common", d) is None and config_overrides("c", d) is None  # a base alone is not one


def test_seeds_name_reruns_that_set_every_training_seed_and_are_not_inherited(tmp_path):
    d = write(tmp_path, a="seeds: 3\ntrain: {max_steps: 120}\n", b="base: a\n")
    assert config_names(d) == ["a", "a-seed1", "a-seed2", "b"]
    assert config_overrides("a-seed2", d) == {"train": {"max_steps": 120, "seed": 2}, "querygen": {"seed": 2},
                                              "hierarchy": {"seed": 2}}
    assert config_files("a-seed2", d) == [d / "a.yaml"]
    assert config_overrides("a-seed3", d) is None and config_overrides("b-seed1", d) is None
    assert config_overrides("a-seed1-seed1", d) is None


def test_bases_that_loop_are_refused(tmp_path):
    d = write(tmp_path, a="base: b\n", b="base: a\n")
    with pytest.raises(ValueError, match="loop"):
        config_overrides("a", d)


def test_the_shipped_files_are_configurations_the_params_accept(tmp_path):
    assert "ct-long-leafneg-suponly-seed2" in PIPELINE_CONFIGS and (CONFIG_DIR / "_scifact.yaml").is_file()
    for overrides in PIPELINE_CONFIGS.values():
        configs.resolve_params(overrides, tmp_path)  # raises on a setting the params do not have


def test_every_configuration_a_committed_result_cites_is_defined():
    """Results rows (published and archived), sweeps and the index-cost run name configurations that
    provenance re-resolves: each must still be read from a file."""
    cited = set()
    for folder in ("results", "archive"):
        for path in (PROJECT / "benchmarks" / folder).glob("*/*.json"):
            row = json.loads(path.read_text())
            if "ndcg@10" in row.get("metrics", {}):
                cited.add(row["config"])
            cited.update(row.get("configs", {}) if row.get("config") == "index-cost" else ())
        for path in (PROJECT / "benchmarks" / folder).glob("*/sweeps/*.json"):
            row = json.loads(path.read_text())
            cited.update((row["base"], row["baseline"]))
    assert len(cited) > 30
    assert sorted(name for name in cited if name not in PIPELINE_CONFIGS) == []
