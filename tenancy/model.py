"""Tenants, API keys, ACL bindings and quotas: the typed records the store holds.

Records are frozen dataclasses with a JSON form (what etcd stores). Names
follow the rules the gateway relies on: a tenant's name prefixes its topics
and groups on the brokers (``<tenant>.orders``), so it may not contain a dot.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from shoal.tenancy.scram import ScramCredential, ScramMechanism

_TENANT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
WILDCARD: Final = "*"


class TenancyError(ValueError):
    """A request the tenancy rules refuse; the message says why."""


class ConcurrentChangeError(TenancyError):
    """A record changed between this writer's read and its write (another writer got
    there first): nothing was written, and the same request made again reads the
    new state. Not the request's fault, so a controller retries it."""


def validate_tenant_name(name: str) -> str:
    """Lower-case letters, digits and inner dashes, at most 63: a DNS label, so a
    Tenant resource can carry it, and never a dot, which separates it from topic names."""
    if not _TENANT_NAME.match(name):
        raise TenancyError(
            f"tenant name {name!r}: use 1-63 lower-case letters, digits and inner dashes"
        )
    return name


class ResourceType(enum.IntEnum):
    """Kafka's AclResourceType numbering."""

    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(enum.IntEnum):
    """Kafka's PatternType numbering: LITERAL (a name, or ``*``) and PREFIXED."""

    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    """Kafka's AclOperation numbering."""

    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class Permission(enum.IntEnum):
    """Kafka's AclPermissionType numbering."""

    DENY = 2
    ALLOW = 3


class BindingSource(enum.Enum):
    """Who wrote a binding, so each writer replaces only its own.

    The operator makes a tenant's declared bindings equal to its Tenant
    resource; bindings a tenant made over Kafka's CreateAcls live beside them
    and are the tenant's to delete (docs/acls.md).
    """

    DECLARED = "declared"
    """Declared on a Tenant resource, by a key's role, or with the CLI."""
    KAFKA_API = "kafka-api"
    """Made by one of the tenant's keys through CreateAcls."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One rule of a tenant: ``principal`` (a key id, or ``*`` for every key of the
    tenant) may or may not do ``operation`` on resources matching the pattern.

    Resource names are the tenant's own (``orders``), never the brokers'
    prefixed names: a binding cannot reach outside its tenant.
    """

    tenant: str
    principal: str
    resource_type: ResourceType
    pattern_type: PatternType
    resource_name: str
    operation: Operation
    permission: Permission = Permission.ALLOW
    source: BindingSource = BindingSource.DECLARED

    def __post_init__(self) -> None:
        # An empty PREFIXED name would match everything: Kafka refuses it too.
        if not self.resource_name:
            raise TenancyError("an ACL binding needs a resource name (or * for all)")

    def to_dict(self) -> dict[str, Any]:
        data = {
            "tenant": self.tenant,
            "principal": self.principal,
            "resource_type": self.resource_type.name,
            "pattern_type": self.pattern_type.name,
            "resource_name": self.resource_name,
            "operation": self.operation.name,
            "permission": self.permission.name,
        }
        # Declared bindings keep the form (and so the store id) they had before
        # sources existed; an API-made twin of one gets an id of its own.
        if self.source is not BindingSource.DECLARED:
            data["source"] = self.source.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AclBinding:
        return cls(
            data["tenant"],
            data["principal"],
            ResourceType[data["resource_type"]],
            PatternType[data["pattern_type"]],
            data["resource_name"],
            Operation[data["operation"]],
            Permission[data["permission"]],
            BindingSource(data.get("source", BindingSource.DECLARED.value)),
        )


@dataclass(frozen=True, slots=True)
class Quotas:
    """A tenant's limits; None is unlimited."""

    producer_byte_rate: float | None = None
    consumer_byte_rate: float | None = None
    max_partitions: int | None = None
    max_connections: int | None = None
    """Open Kafka connections over all gateway replicas; more are refused at login."""
    controller_mutation_rate: float | None = None
    """Partitions a second the tenant may create or delete (CreateTopics, CreatePartitions,
    DeleteTopics): Kafka's KIP-599 quota, a token bucket bursting 11 seconds' worth."""
    max_storage_bytes: int | None = None
    """Bytes the tenant's data may take once (leader replicas); at or past it, produce is
    refused until records or topics are deleted (``shoal.gateway.storage_limit``)."""
    max_connection_rate: float | None = None
    """Kafka connections a second the tenant may open over all gateway replicas (Kafka's
    KIP-612 ``connection_creation_rate``); faster logins are held, and refused past 10 s
    (``shoal.gateway.connection_rate``)."""
    request_percentage: float | None = None
    """Share of one request-handling thread's time the tenant's requests may take over all
    gateway replicas, in percent per quota window (Kafka's KIP-124 quota; above 100 is
    more than one thread); past it, answers carry a throttle and connections are muted
    (``shoal.gateway.request_quota``)."""


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    created_ms: int
    quotas: Quotas = field(default_factory=Quotas)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Tenant:
        data = json.loads(raw)
        return cls(data["name"], data["created_ms"], Quotas(**data.get("quotas", {})))


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key: its id (the SASL username) and only a slow hash of its secret."""

    key_id: str
    tenant: str
    secret_hash: str
    created_ms: int
    description: str = ""
    revoked_ms: int | None = None
    platform_admin: bool = False
    """May use the platform's client-quota APIs (every tenant's quotas)."""
    scram: tuple[ScramCredential, ...] = ()
    """SCRAM-SHA-256/512 credentials, made with the key (:mod:`shoal.tenancy.scram`);
    empty for a key minted before SCRAM sign-in existed."""
    certificate_subject: str | None = None
    """Clients presenting a certificate with this subject (canonical RFC 4514,
    :mod:`shoal.tenancy.certificates`) on the gateway's mutual-TLS listener sign in as
    this key. At most one live key holds a subject (the store enforces it)."""

    @property
    def revoked(self) -> bool:
        return self.revoked_ms is not None

    def scram_credential(self, mechanism: ScramMechanism) -> ScramCredential | None:
        return next((c for c in self.scram if c.mechanism is mechanism), None)

    def to_json(self) -> bytes:
        data = asdict(self)
        data["scram"] = [c.to_dict() for c in self.scram]
        return json.dumps(data).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> ApiKey:
        data = json.loads(raw)
        scram = tuple(ScramCredential.from_dict(c) for c in data.pop("scram", ()))
        return cls(**data, scram=scram)
