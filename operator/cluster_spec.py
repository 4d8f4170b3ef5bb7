"""A Cluster's spec as a typed value, with the CRD's defaults applied and its rules checked.

The API server applies the defaults of ``k8s/crds/clusters.shoal.dev.yaml``
and rejects what its schema forbids, but the fake API server of the tests
does neither, and a spec edited before the CRD was upgraded may lack newer
fields. :meth:`ClusterSpec.from_spec` therefore re-applies every default and
checks every rule the builders rely on, raising :class:`ValueError` with a
message that names the field, so the operator can report it on the Cluster's
status instead of building broken children.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

IMAGE_PULL_POLICIES: Final = ("Always", "IfNotPresent", "Never")
SERVICE_TYPES: Final = ("ClusterIP", "NodePort", "LoadBalancer")
ETCD_REPLICAS: Final = (1, 3, 5)
MAX_BROKERS: Final = 64

DEFAULT_BROKERS: Final = 3
DEFAULT_BROKER_STORAGE: Final = "10Gi"
DEFAULT_ETCD_REPLICAS: Final = 3
DEFAULT_ETCD_STORAGE: Final = "1Gi"
DEFAULT_GATEWAYS: Final = 2

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
_SETTING = re.compile(r"^[a-z][a-z0-9_]*$")

OPERATOR_OWNED_BROKER_SETTINGS: Final = frozenset(
    {
        "node_id",
        "data_dir",
        "listen",
        "advertise",
        "etcd",
        "rack",
        "metrics_listen",
        "log_format",
        "topic_defaults",
    }
)
"""Broker settings the builders set themselves; ``spec.brokers.config`` may not override them."""


class ClusterSpecError(ValueError):
    """A Cluster spec the builders cannot turn into children; the message names the field."""


@dataclass(frozen=True, slots=True)
class StorageSpec:
    size: str
    storage_class_name: str | None


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Everything the builders need from ``Cluster.spec``, defaults applied."""

    image: str | None
    """None: the operator's own image."""
    image_pull_policy: str
    brokers: int
    broker_storage: StorageSpec
    broker_delete_claim: bool
    broker_resources: Mapping[str, Any]
    rack_label: str | None
    broker_config: Mapping[str, str]
    """Broker settings by field name (``replica_lag_time_max_ms``), read as SHOAL_<NAME>."""
    etcd_replicas: int
    etcd_storage: StorageSpec
    etcd_resources: Mapping[str, Any]
    gateway_replicas: int
    gateway_service_type: str
    gateway_advertise_host: str | None
    gateway_tls_secret: str | None
    """A kubernetes.io/tls Secret; set, the gateway's Kafka listener is SASL_SSL."""
    gateway_client_ca_secret: str | None
    """A Secret whose ``ca.crt`` holds the CAs of client certificates; set, the gateway
    also runs its mutual-TLS listener (needs ``gateway_tls_secret``, its server certificate)."""
    gateway_resources: Mapping[str, Any]
    topic_defaults: Mapping[str, str]
    """Broker-wide topic defaults by Kafka broker property (``log.retention.ms``)."""

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> ClusterSpec:
        """Read ``Cluster.spec``; raises ClusterSpecError (a ValueError) naming the field."""
        spec = _section(spec, "spec")
        brokers = _section(spec.get("brokers"), "spec.brokers")
        etcd = _section(spec.get("etcd"), "spec.etcd")
        gateway = _section(spec.get("gateway"), "spec.gateway")
        tls, client_ca = _tls(gateway)
        return cls(
            image=_optional_str(spec, "image", "spec"),
            image_pull_policy=_choice(
                spec, "imagePullPolicy", "spec", IMAGE_PULL_POLICIES, "IfNotPresent"
            ),
            brokers=_int(brokers, "replicas", "spec.brokers", DEFAULT_BROKERS, 1, MAX_BROKERS),
            broker_storage=_storage(brokers, "spec.brokers", DEFAULT_BROKER_STORAGE),
            broker_delete_claim=_bool(
                _section(brokers.get("storage"), "spec.brokers.storage"),
                "deleteClaim",
                "spec.brokers.storage",
            ),
            broker_resources=_section(brokers.get("resources"), "spec.brokers.resources"),
            rack_label=_optional_str(brokers, "rackLabel", "spec.brokers"),
            broker_config=_broker_config(brokers.get("config")),
            etcd_replicas=_etcd_replicas(etcd),
            etcd_storage=_storage(etcd, "spec.etcd", DEFAULT_ETCD_STORAGE),
            etcd_resources=_section(etcd.get("resources"), "spec.etcd.resources"),
            gateway_replicas=_int(gateway, "replicas", "spec.gateway", DEFAULT_GATEWAYS, 1, None),
            gateway_service_type=_choice(
                gateway, "serviceType", "spec.gateway", SERVICE_TYPES, "ClusterIP"
            ),
            gateway_advertise_host=_optional_str(gateway, "advertiseHost", "spec.gateway"),
            gateway_tls_secret=tls,
            gateway_client_ca_secret=client_ca,
            gateway_resources=_section(gateway.get("resources"), "spec.gateway.resources"),
            topic_defaults=_strings(spec.get("topicDefaults"), "spec.topicDefaults"),
        )


def _tls(gateway: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The names of the TLS Secret and the client CA Secret; None when not given."""
    if gateway.get("tls") is None:
        return None, None
    tls = _section(gateway["tls"], "spec.gateway.tls")
    secret = _optional_str(tls, "secretName", "spec.gateway.tls")
    client_ca = _optional_str(tls, "clientCASecretName", "spec.gateway.tls")
    if secret is None and client_ca is not None:
        raise ClusterSpecError(
            "spec.gateway.tls.clientCASecretName needs spec.gateway.tls.secretName"
            " (a kubernetes.io/tls Secret: the certificate the mutual-TLS listener serves)"
        )
    if secret is None:
        raise ClusterSpecError("spec.gateway.tls needs secretName (a kubernetes.io/tls Secret)")
    return secret, client_ca


def _section(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClusterSpecError(f"{where} must be an object, not {type(value).__name__}")
    return dict(value)


def _optional_str(section: Mapping[str, Any], key: str, where: str) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ClusterSpecError(f"{where}.{key} must be a non-empty string, not {value!r}")
    return value


def _choice(
    section: Mapping[str, Any], key: str, where: str, choices: tuple[str, ...], default: str
) -> str:
    value = section.get(key, default)
    if value not in choices:
        raise ClusterSpecError(f"{where}.{key} must be one of {', '.join(choices)}, not {value!r}")
    return str(value)


def _int(
    section: Mapping[str, Any], key: str, where: str, default: int, low: int, high: int | None
) -> int:
    value = section.get(key, default)
    # bool is an int to Python, never to the CRD's schema.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClusterSpecError(f"{where}.{key} must be an integer, not {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ClusterSpecError(f"{where}.{key} must be {bounds}, not {value}")
    return value


def _bool(section: Mapping[str, Any], key: str, where: str) -> bool:
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise ClusterSpecError(f"{where}.{key} must be true or false, not {value!r}")
    return value


def _etcd_replicas(etcd: Mapping[str, Any]) -> int:
    value = _int(etcd, "replicas", "spec.etcd", DEFAULT_ETCD_REPLICAS, 1, max(ETCD_REPLICAS))
    if value not in ETCD_REPLICAS:
        # An even member count adds no fault tolerance over the odd one below it.
        raise ClusterSpecError(f"spec.etcd.replicas must be 1, 3 or 5, not {value}")
    return value


def _storage(section: Mapping[str, Any], where: str, default_size: str) -> StorageSpec:
    storage = _section(section.get("storage"), f"{where}.storage")
    size = storage.get("size", default_size)
    if not isinstance(size, str) or not _QUANTITY.match(size):
        raise ClusterSpecError(
            f"{where}.storage.size must be a quantity such as 10Gi, not {size!r}"
        )
    return StorageSpec(size, _optional_str(storage, "storageClassName", f"{where}.storage"))


def _strings(value: Any, where: str) -> dict[str, str]:
    section = _section(value, where)
    for key, item in section.items():
        if not isinstance(item, str):
            raise ClusterSpecError(f"{where}.{key} must be a string, not {item!r} (quote it)")
    return section


def _broker_config(value: Any) -> dict[str, str]:
    config = _strings(value, "spec.brokers.config")
    for key in config:
        if not _SETTING.match(key):
            raise ClusterSpecError(
                f"spec.brokers.config: {key!r} is not a broker setting name"
                " (lower case with underscores, as in replica_lag_time_max_ms)"
            )
        if key in OPERATOR_OWNED_BROKER_SETTINGS:
            raise ClusterSpecError(
                f"spec.brokers.config.{key} is set by the operator and cannot be set"
            )
    return config
