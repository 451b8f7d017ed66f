"""The Kubernetes deployment (``orchestration/k8s/``) without a cluster: the instance file and the
executor's config pass dagster-k8s's and dagster-postgres's schemas (a misspelt key is refused by
name), the Definitions load with the pod-per-step executor, and each step of the full pipeline
renders, through dagster-k8s's own ``construct_dagster_k8s_job``, to the Kubernetes Job it would
submit: the image, the environment, the workspace volume, and a GPU for the train step only."""

import pytest
import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config_schema
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster_k8s import DagsterK8sJobConfig, K8sRunLauncher, construct_dagster_k8s_job, k8s_job_executor
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import UserDefinedDagsterK8sConfig, get_user_defined_k8s_config
from dagster_postgres import DagsterPostgresStorage

from tests.conftest import REPOSITORY

K8S = REPOSITORY / "orchestration" / "k8s"


def load(name: str) -> dict:
    return yaml.safe_load((K8S / name).read_text())


def test_the_instance_file_passes_the_schemas_of_its_classes(monkeypatch):
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "from-a-secret")  # the file reads it from the environment
    instance = load("dagster.yaml")
    for schema, value in ((dagster_instance_config_schema(), instance),
                          (K8sRunLauncher.config_type(), instance["run_launcher"]["config"]),
                          (DagsterPostgresStorage.config_type(), instance["storage"]["postgres"]),
                          (QueuedRunCoordinator.config_type(), instance["run_coordinator"]["config"])):
        result = process_config(schema, value)
        assert result.success, [error.message for error in result.errors]
    assert instance["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
    misspelt = {**instance["run_launcher"]["config"], "job_namespce": "x"}
    result = process_config(K8sRunLauncher.config_type(), misspelt)
    assert not result.success and 'unexpected config entry "job_namespce"' in result.errors[0].message


def test_each_step_renders_to_a_kubernetes_job_and_the_train_step_asks_for_a_gpu():
    from orchestration.k8s.definitions import EXECUTOR_CONFIG, defs

    job = defs.resolve_job_def("full_pipeline")
    assert job.executor_def.name == "k8s"
    checked = process_config(k8s_job_executor.config_schema.config_type, EXECUTOR_CONFIG)
    assert checked.success, [error.message for error in checked.errors]
    config, launcher = checked.value, load("dagster.yaml")["run_launcher"]["config"]
    # the executor's own container context, as k8s_job_executor builds it from its config
    executor = K8sContainerContext(
        image_pull_policy=config["image_pull_policy"], service_account_name=config["service_account_name"],
        env_config_maps=config["env_config_maps"], env_secrets=config["env_secrets"],
        volume_mounts=config["volume_mounts"], volumes=config["volumes"], namespace=config["job_namespace"],
        run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(config["step_k8s_config"]))
    job_config = DagsterK8sJobConfig(job_image=config["job_image"], dagster_home=launcher["dagster_home"],
                                     instance_config_map=launcher["instance_config_map"],
                                     postgres_password_secret=launcher["postgres_password_secret"])
    gpus = {}
    for node in job.graph.nodes:
        step = executor.merge(K8sContainerContext(run_k8s_config=get_user_defined_k8s_config(node.definition.tags)))
        rendered = construct_dagster_k8s_job(job_config, ["dagster", "api", "execute_step"], f"dagster-step-{node.name}",
                                             user_defined_k8s_config=step.run_k8s_config, component="step_worker")
        pod = rendered.spec.template.spec
        [container] = pod.containers
        assert container.image == "registry.example.com/fresh-retriever:latest"
        assert pod.service_account_name == "fresh-retriever"
        assert [m.mount_path for m in container.volume_mounts if m.name == "workspace"] == ["/workspace"]
        assert [v.persistent_volume_claim.claim_name for v in pod.volumes if v.name == "workspace"] == [
            "fresh-retriever-workspace"]
        sources = {(s.config_map_ref or s.secret_ref).name for s in container.env_from}
        assert {"fresh-retriever-env", "fresh-retriever-secrets"} <= sources
        env = {e.name: e for e in container.env}
        assert env["DAGSTER_PG_PASSWORD"].value_from.secret_key_ref.name == "fresh-retriever-postgresql"
        assert env["DAGSTER_HOME"].value == "/opt/dagster/dagster_home"
        assert container.resources.requests == {"cpu": "2", "memory": "8Gi"}
        gpus[node.name] = (container.resources.limits or {}).get("nvidia.com/gpu")
    assert gpus.pop("encoder") == "1"  # the train stage's asset
    assert set(gpus) >= {"corpus", "retriever_index", "evaluation", "registered_model"} and not any(gpus.values())


def test_a_misspelt_executor_setting_fails_the_definitions_naming_the_file_and_key(tmp_path):
    from orchestration.k8s.definitions import EXECUTOR_CONFIG, k8s_executor

    path = tmp_path / "executor.yaml"
    path.write_text(yaml.safe_dump({**EXECUTOR_CONFIG, "max_concurent": 2}))
    with pytest.raises(ValueError, match=rf'{path}: Received unexpected config entry "max_concurent"'):
        k8s_executor(path)


@pytest.mark.parametrize("name", ["values.yaml"])
def test_the_helm_values_name_the_same_image_module_and_storage(name):
    """The Dagster Helm chart's values load this project's Kubernetes Definitions with the image and
    PostgreSQL the instance file names (the chart itself is not rendered here: no helm)."""
    values, instance = load(name), load("dagster.yaml")
    [deployment] = values["dagster-user-deployments"]["deployments"]
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "orchestration.k8s.definitions"]
    image = deployment["image"]
    assert f"{image['repository']}:{image['tag']}" == load("executor.yaml")["job_image"]
    assert values["postgresql"]["enabled"] is False  # the instance's PostgreSQL is a service of its own
    assert values["global"]["postgresqlSecretName"] == instance["run_launcher"]["config"]["postgres_password_secret"]
    assert values["postgresql"]["postgresqlHost"] == instance["storage"]["postgres"]["postgres_db"]["hostname"]
    limits = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["tagConcurrencyLimits"]
    assert limits == instance["run_coordinator"]["config"]["tag_concurrency_limits"]  # one deployment change at a time
