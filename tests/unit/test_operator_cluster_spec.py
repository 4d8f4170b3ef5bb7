"""ClusterSpec.from_spec applies the CRD's defaults and rejects what the CRD forbids.

The defaults are read from the CRD itself, so the two cannot drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from shoal.operator.cluster_spec import ClusterSpec, StorageSpec

CRD = Path(__file__).resolve().parents[2] / "k8s" / "crds" / "clusters.shoal.dev.yaml"


def crd_spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def default(*path: str) -> Any:
    node = crd_spec_schema()
    for key in path:
        node = node["properties"][key]
    return node["default"]


def test_empty_spec_gets_every_default_of_the_crd() -> None:
    spec = ClusterSpec.from_spec({})
    assert spec.image is None
    assert spec.image_pull_policy == default("imagePullPolicy")
    assert spec.brokers == default("brokers", "replicas")
    assert spec.broker_storage == StorageSpec(default("brokers", "storage", "size"), None)
    assert spec.broker_delete_claim is default("brokers", "storage", "deleteClaim")
    assert spec.etcd_replicas == default("etcd", "replicas")
    assert spec.etcd_storage == StorageSpec(default("etcd", "storage", "size"), None)
    assert spec.gateway_replicas == default("gateway", "replicas")
    assert spec.gateway_service_type == default("gateway", "serviceType")
    assert spec.gateway_tls_secret is None
    assert spec.gateway_client_ca_secret is None
    assert spec.rack_label is None
    assert spec.broker_config == {}
    assert spec.topic_defaults == {}


def test_given_fields_are_read() -> None:
    spec = ClusterSpec.from_spec(
        {
            "image": "registry.example/shoal:1.2.3",
            "imagePullPolicy": "Always",
            "brokers": {
                "replicas": 5,
                "storage": {"size": "50Gi", "storageClassName": "fast", "deleteClaim": True},
                "resources": {"requests": {"cpu": "1"}},
                "rackLabel": "topology.kubernetes.io/zone",
                "config": {"replica_lag_time_max_ms": "10000"},
            },
            "etcd": {"replicas": 1, "storage": {"size": "2Gi"}},
            "gateway": {
                "replicas": 4,
                "serviceType": "LoadBalancer",
                "advertiseHost": "kafka.example.com",
                "tls": {"secretName": "gateway-tls", "clientCASecretName": "client-ca"},
            },
            "topicDefaults": {"min.insync.replicas": "2"},
        }
    )
    assert spec.image == "registry.example/shoal:1.2.3"
    assert spec.image_pull_policy == "Always"
    assert spec.brokers == 5
    assert spec.broker_storage == StorageSpec("50Gi", "fast")
    assert spec.broker_delete_claim is True
    assert spec.broker_resources == {"requests": {"cpu": "1"}}
    assert spec.rack_label == "topology.kubernetes.io/zone"
    assert spec.broker_config == {"replica_lag_time_max_ms": "10000"}
    assert spec.etcd_replicas == 1
    assert spec.etcd_storage == StorageSpec("2Gi", None)
    assert spec.gateway_replicas == 4
    assert spec.gateway_service_type == "LoadBalancer"
    assert spec.gateway_advertise_host == "kafka.example.com"
    assert spec.gateway_tls_secret == "gateway-tls"
    assert spec.gateway_client_ca_secret == "client-ca"
    assert spec.topic_defaults == {"min.insync.replicas": "2"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"gateway": {"tls": {}}}, "spec.gateway.tls needs secretName"),
        ({"gateway": {"tls": {"secretName": ""}}}, "spec.gateway.tls.secretName"),
        (
            {"gateway": {"tls": {"clientCASecretName": "client-ca"}}},
            "spec.gateway.tls.clientCASecretName needs spec.gateway.tls.secretName",
        ),
        (
            {"gateway": {"tls": {"secretName": "tls", "clientCASecretName": ""}}},
            "spec.gateway.tls.clientCASecretName must be a non-empty string",
        ),
        ({"brokers": {"replicas": 0}}, "spec.brokers.replicas must be between 1 and 64"),
        ({"brokers": {"replicas": 65}}, "spec.brokers.replicas must be between 1 and 64"),
        ({"brokers": {"replicas": "3"}}, "spec.brokers.replicas must be an integer"),
        ({"brokers": {"replicas": True}}, "spec.brokers.replicas must be an integer"),
        ({"etcd": {"replicas": 2}}, "spec.etcd.replicas must be 1, 3 or 5"),
        ({"gateway": {"replicas": 0}}, "spec.gateway.replicas must be at least 1"),
        ({"gateway": {"serviceType": "ExternalName"}}, "spec.gateway.serviceType must be one of"),
        ({"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy must be one of"),
        ({"image": ""}, "spec.image must be a non-empty string"),
        ({"brokers": {"storage": {"size": "lots"}}}, "spec.brokers.storage.size"),
        ({"brokers": {"storage": {"deleteClaim": "yes"}}}, "deleteClaim must be true or false"),
        ({"brokers": []}, "spec.brokers must be an object"),
        ({"topicDefaults": {"retention.ms": 1000}}, "spec.topicDefaults.retention.ms"),
        ({"brokers": {"config": {"Replica-Lag": "1"}}}, "is not a broker setting name"),
        ({"brokers": {"config": {"node_id": "7"}}}, "set by the operator"),
        ({"brokers": {"config": {"etcd": "http://elsewhere"}}}, "set by the operator"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ClusterSpec.from_spec(spec)
