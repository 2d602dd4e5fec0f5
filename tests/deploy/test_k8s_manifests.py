"""The Kubernetes manifests of docs/deploy/k8s/: valid against the Kubernetes schemas
(kubernetes-validate, strict: no field Kubernetes does not know), and true to simnpu."""

from __future__ import annotations

import copy
import pathlib
import re

import kubernetes_validate
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "docs" / "deploy" / "k8s").glob("*.yaml"))
VERSION = kubernetes_validate.latest_version()


def load(name: str) -> dict:
    (document,) = yaml.safe_load_all((ROOT / "docs" / "deploy" / "k8s" / name).read_text())
    return document


def validate(document: dict) -> None:
    kubernetes_validate.validate(document, VERSION, strict=True)


def test_there_are_manifests():
    assert {path.name for path in MANIFESTS} >= {"service.yaml", "statefulset.yaml"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_each_manifest_is_valid_against_the_kubernetes_schemas(path):
    for document in yaml.safe_load_all(path.read_text()):
        validate(document)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda s: s["spec"].update(replicas="two"),
        lambda s: s["spec"]["template"]["spec"]["containers"][0].update(imagePull="Always"),
        lambda s: s["spec"].pop("selector"),
    ],
    ids=["a string for a number", "an unknown field", "a missing required field"],
)
def test_the_validation_refuses_a_broken_statefulset(break_it):
    broken = copy.deepcopy(load("statefulset.yaml"))
    break_it(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


def _env(container: dict) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env", [])}


def test_the_statefulset_is_true_to_simnpu():
    service, stateful = load("service.yaml"), load("statefulset.yaml")
    pod = stateful["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    daemon, ranks = _env(containers["npu"]), _env(containers["ranks"])
    assert stateful["spec"]["serviceName"] == service["metadata"]["name"] == "simnpu"
    world = int(ranks["SIMNPU_WORLD_SIZE"])
    assert world == stateful["spec"]["replicas"] * int(ranks["RANKS_PER_HOST"])
    # the seed is pod 0's daemon as that daemon advertises itself
    advertise = daemon["SIMNPU_ADVERTISE"]
    assert ranks["SIMNPU_JOB_SEED"] == advertise.replace("$(POD_NAME)", "simnpu-0")
    assert advertise.endswith(":50151") and "0.0.0.0:50151" in daemon["SIMNPU_LISTEN"]
    # every SIMNPU_ / HCCL_ variable the manifest sets is one simnpu reads
    sources = "\n".join(
        path.read_text()
        for folder in ("server", "client", "proto")
        for path in (ROOT / folder).rglob("*.py")
    )
    for name in {**daemon, **ranks}:
        if re.match(r"(SIMNPU|HCCL)_", name):
            assert f'"{name}"' in sources, f"simnpu reads no {name}"
    mounts = {m["name"]: m["mountPath"] for m in containers["ranks"]["volumeMounts"]}
    assert mounts == {m["name"]: m["mountPath"] for m in containers["npu"]["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"  # device memory, shared with the daemon
