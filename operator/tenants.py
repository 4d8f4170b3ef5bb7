"""A Tenant resource made real: tenancy records in etcd and a Secret per API key.

:func:`reconcile_tenant` is idempotent. It creates the tenant (or sets its
quotas), then settles its keys:

* A wanted key whose existing Secret still holds a live key of this tenant
  (not revoked, and the password verifies against the stored hash) is kept;
  otherwise a new key is minted and its Secret (re)written. Secrets are
  returned for every wanted key, so a changed gateway address or TLS setting
  reaches the kept ones too.
* The keys this operator made are marked by their description,
  ``k8s:<namespace>/<Tenant name>/<key name>``. Marked keys the spec no longer
  wants (or that a new key replaced) are revoked and the Secrets of unwanted
  names listed for deletion. Keys made by anyone else (the CLI, the tenant
  itself over the HTTP API) are left alone.
* A key's ``certificateSubject`` (if any) is claimed with the key, or set on a
  kept key (cleared when the spec drops it): clients with a certificate of
  that subject, signed by the Cluster's client CA, sign in as the key on the
  gateway's mutual-TLS listener. A subject held by a key this resource does not
  manage (another tenant's, or one made with the CLI) refuses the spec before
  any key is written.
* The declared bindings of the operator's keys, and the tenant-wide ones
  (principal ``*``), are made equal to the spec: the role's bindings plus
  ``spec.acls``. Bindings the tenant made with Kafka's CreateAcls are its own
  and left alone (docs/acls.md).

Secrets come back as manifests without ownerReferences: the handler adds the
Tenant as owner and applies them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from shoal.gateway.namespace import Namespace
from shoal.operator.client_settings import client_properties, jaas_config, properties_text
from shoal.operator.endpoints import ClusterEndpoints, key_secret_name
from shoal.operator.kafka_admin import ClusterAdmin
from shoal.tenancy.certificates import canonical_subject
from shoal.tenancy.keys import KeyRole, mint_key, role_bindings
from shoal.tenancy.model import (
    WILDCARD,
    AclBinding,
    ApiKey,
    BindingSource,
    Operation,
    PatternType,
    Permission,
    Quotas,
    ResourceType,
    TenancyError,
    Tenant,
    validate_tenant_name,
)
from shoal.tenancy.secrets import verify_secret
from shoal.tenancy.store import TenancyStore

TENANT_LABEL: Final = "shoal.dev/tenant"
KEY_LABEL: Final = "shoal.dev/key"
MARKER_PREFIX: Final = "k8s:"
_KEY_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")


class CertificateSubjectTakenError(TenancyError):
    """A key of the spec wants a certificate subject that a key this Tenant does not
    manage holds: only the spec (or revoking that key) can fix it."""


@dataclass(frozen=True, slots=True)
class KeySpec:
    name: str
    role: KeyRole
    description: str = ""
    certificate_subject: str | None = None
    """Canonical RFC 4514 subject of the client certificates that sign in as the key."""


@dataclass(frozen=True, slots=True)
class AclSpec:
    """One entry of spec.acls: for the key named ``key``, or every key (``*``)."""

    key: str
    resource_type: ResourceType
    pattern_type: PatternType
    resource_name: str
    operation: Operation
    permission: Permission

    def binding(self, tenant: str, principal: str) -> AclBinding:
        return AclBinding(
            tenant,
            principal,
            self.resource_type,
            self.pattern_type,
            self.resource_name,
            self.operation,
            self.permission,
        )


@dataclass(frozen=True, slots=True)
class TenantSpec:
    resource_name: str
    """The Tenant resource's metadata.name."""
    namespace: str
    cluster: str
    tenant: str
    """The tenant's id on the cluster."""
    quotas: Quotas
    keys: tuple[KeySpec, ...]
    acls: tuple[AclSpec, ...]

    @classmethod
    def from_resource(
        cls, name: str, spec: Mapping[str, Any], namespace: str = "default"
    ) -> TenantSpec:
        """Read a Tenant's spec, re-applying the CRD's defaults and checks (a fake API
        server applies neither); raises ValueError saying what is wrong."""
        cluster = spec.get("cluster")
        if not isinstance(cluster, str) or not cluster:
            raise ValueError("spec.cluster: name the Cluster the tenant lives on")
        tenant = validate_tenant_name(str(spec.get("name") or name))
        keys = tuple(_key_spec(item) for item in spec.get("keys") or ())
        names = [k.name for k in keys]
        if len(set(names)) != len(names):
            raise ValueError("spec.keys: each key needs a name of its own")
        subjects = [k.certificate_subject for k in keys if k.certificate_subject is not None]
        if len(set(subjects)) != len(subjects):
            raise ValueError("spec.keys: each key needs a certificateSubject of its own")
        acls = tuple(_acl_spec(item) for item in spec.get("acls") or ())
        for acl in acls:
            if acl.key != WILDCARD and acl.key not in names:
                raise ValueError(f'spec.acls: key {acl.key!r} is not in spec.keys (nor "*")')
            acl.binding(tenant, WILDCARD)  # refuses what no binding may hold
        return cls(name, namespace, cluster, tenant, _quotas(spec.get("quotas") or {}), keys, acls)

    def marker(self, key: str) -> str:
        """The description prefix that marks a key as this resource's ``key``."""
        return f"{MARKER_PREFIX}{self.namespace}/{self.resource_name}/{key}"

    def marked_key_name(self, key: ApiKey) -> str | None:
        """The key name, if ``key`` is one this resource made."""
        prefix = self.marker("")
        if key.tenant != self.tenant or not key.description.startswith(prefix):
            return None
        return key.description[len(prefix) :].split(" ", 1)[0] or None


def _key_spec(item: Mapping[str, Any]) -> KeySpec:
    name = item.get("name")
    # The name goes into a Secret's name and the key's marker: the CRD's pattern keeps
    # it a short DNS label, and a fake API server does not apply the pattern.
    if not isinstance(name, str) or not _KEY_NAME.match(name):
        raise ValueError(
            f"spec.keys: key name {name!r}: use 1-32 lower-case letters, digits, inner dashes"
        )
    try:
        role = KeyRole(item.get("role", KeyRole.DEFAULT.value))
    except ValueError:
        raise ValueError(
            f"spec.keys[{name}].role: one of {', '.join(r.value for r in KeyRole)}"
        ) from None
    return KeySpec(name, role, str(item.get("description", "")), _subject(name, item))


def _subject(name: str, item: Mapping[str, Any]) -> str | None:
    subject = item.get("certificateSubject")
    if subject is None:
        return None
    try:
        # Not a string (a fake API server skips the CRD's type): refused as an empty one.
        return canonical_subject(subject if isinstance(subject, str) else "")
    except TenancyError as exc:
        raise ValueError(f"spec.keys[{name}].certificateSubject: {exc}") from None


def _acl_spec(item: Mapping[str, Any]) -> AclSpec:
    try:
        return AclSpec(
            str(item["key"]),
            ResourceType[item["resourceType"]],
            PatternType[item.get("patternType", "LITERAL")],
            str(item["resourceName"]),
            Operation[item["operation"]],
            Permission[item.get("permission", "ALLOW")],
        )
    except KeyError as exc:
        raise ValueError(f"spec.acls: missing or unknown {exc.args[0]!r} in {dict(item)}") from None


def _quotas(quotas: Mapping[str, Any]) -> Quotas:
    def limit(field_name: str, low: int) -> int | None:
        value = quotas.get(field_name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"spec.quotas.{field_name}: a whole number of at least {low}")
        return value

    def rate(field_name: str) -> float | None:
        value = quotas.get(field_name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"spec.quotas.{field_name}: a number greater than 0")
        return float(value)

    return Quotas(
        limit("producerByteRate", 1),
        limit("consumerByteRate", 1),
        limit("maxPartitions", 0),
        limit("maxConnections", 1),
        rate("controllerMutationRate"),
        limit("maxStorageBytes", 1),
        rate("maxConnectionRate"),
        rate("requestPercentage"),
    )


@dataclass(frozen=True, slots=True)
class KeySecret:
    """What a key's Secret holds: enough to keep using the key."""

    key_name: str
    key_id: str
    password: str


def read_key_secret(secret: Mapping[str, Any]) -> KeySecret | None:
    """The key in a Secret as the API returns it (``data`` base64); None if it holds none."""
    labels = (secret.get("metadata") or {}).get("labels") or {}
    data = secret.get("data") or {}
    try:
        username = base64.b64decode(data["username"], validate=True).decode()
        password = base64.b64decode(data["password"], validate=True).decode()
    except (KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        return None
    key_name = labels.get(KEY_LABEL)
    if not isinstance(key_name, str) or not username or not password:
        return None
    return KeySecret(key_name, username, password)


@dataclass(frozen=True, slots=True)
class TenantOutcome:
    secrets: list[dict[str, Any]]
    """Secret manifests to apply (no ownerReferences: the handler adds them)."""
    obsolete_secrets: list[str]
    """Names of Secrets to delete."""
    status: dict[str, Any]
    """The Tenant's status fields: tenant, keyCount, keys."""


def key_secret(
    spec: TenantSpec,
    key: str,
    key_id: str,
    password: str,
    endpoints: ClusterEndpoints,
    tls: bool,
) -> dict[str, Any]:
    """The Secret of one key: its credentials and ready-made client settings."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": key_secret_name(spec.tenant, key),
            "namespace": spec.namespace,
            "labels": {
                "app.kubernetes.io/name": "shoal",
                "app.kubernetes.io/instance": spec.cluster,
                "app.kubernetes.io/managed-by": "shoal-operator",
                TENANT_LABEL: spec.tenant,
                KEY_LABEL: key,
            },
        },
        "type": "Opaque",
        "stringData": {
            "bootstrap": endpoints.gateway_bootstrap,
            "username": key_id,
            "password": password,
            "http": endpoints.gateway_http,
            "client.properties": properties_text(
                client_properties(endpoints.gateway_bootstrap, key_id, password, tls)
            ),
            "sasl.jaas.config": jaas_config(key_id, password),
        },
    }


def wanted_bindings(spec: TenantSpec, key_ids: Mapping[str, str]) -> set[AclBinding]:
    """Every binding the spec asks for, given the id of each wanted key."""
    wanted = {acl.binding(spec.tenant, WILDCARD) for acl in spec.acls if acl.key == WILDCARD}
    for key in spec.keys:
        key_id = key_ids[key.name]
        wanted.update(role_bindings(key.role, spec.tenant, key_id))
        wanted.update(acl.binding(spec.tenant, key_id) for acl in spec.acls if acl.key == key.name)
    return wanted


def binding_changes(
    existing: Iterable[AclBinding], wanted: Iterable[AclBinding], managed: Iterable[str]
) -> tuple[list[AclBinding], list[AclBinding]]:
    """(to add, to remove) so the declared bindings of the ``managed`` principals equal
    ``wanted``; bindings of other principals, and those a tenant made through
    Kafka's CreateAcls (even for a managed principal), stay as they are."""
    have = set(existing)
    want = set(wanted)
    principals = set(managed)
    add = [b for b in want if b not in have]
    remove = [
        b
        for b in have
        if b.source is BindingSource.DECLARED and b.principal in principals and b not in want
    ]
    return sorted(add, key=_order), sorted(remove, key=_order)


def _order(binding: AclBinding) -> tuple[str, ...]:
    return tuple(str(v) for v in binding.to_dict().values())


async def reconcile_tenant(
    store: TenancyStore,
    spec: TenantSpec,
    known_keys: Mapping[str, KeySecret],
    endpoints: ClusterEndpoints,
    tls: bool = False,
) -> TenantOutcome:
    """Make the tenant's records match ``spec``; ``known_keys`` maps key names to what
    their existing Secrets hold. ``tls``: whether the gateway's clients use TLS."""
    await _ensure_tenant(store, spec)
    existing = {k.key_id: k for k in await store.list_keys(spec.tenant)}
    ours = {k.key_id: name for k in existing.values() if (name := spec.marked_key_name(k))}
    kept: dict[str, KeySecret] = {}
    for key in spec.keys:
        held = known_keys.get(key.name)
        if held is not None and await _usable(existing.get(held.key_id), spec.tenant, held):
            kept[key.name] = held
    released = await _release_subjects(store, spec, kept, ours)
    key_ids: dict[str, str] = {}
    secrets = []
    for key in spec.keys:
        held = kept.get(key.name)
        if held is not None:
            key_id, password = held.key_id, held.password
            current = None if key_id in released else existing[key_id].certificate_subject
            if current != key.certificate_subject:
                await store.set_certificate_subject(key_id, key.certificate_subject)
        else:
            key_id, password = await _create_key(store, spec, key)
        key_ids[key.name] = key_id
        secrets.append(key_secret(spec, key.name, key_id, password, endpoints, tls))
    live = set(key_ids.values())
    for key_id in ours.keys() - live:
        if not existing[key_id].revoked:
            await store.revoke_key(key_id, _now_ms())
    managed = {WILDCARD, *ours, *live}
    add, remove = binding_changes(
        await store.list_bindings(spec.tenant), wanted_bindings(spec, key_ids), managed
    )
    for binding in add:
        await store.add_binding(binding)
    for binding in remove:
        await store.remove_binding(binding)
    unwanted = ({*known_keys, *ours.values()}) - {k.name for k in spec.keys}
    return TenantOutcome(
        secrets=secrets,
        obsolete_secrets=sorted(key_secret_name(spec.tenant, name) for name in unwanted),
        status={
            "tenant": spec.tenant,
            "keyCount": len(spec.keys),
            "keys": [_key_status(spec, key, key_ids[key.name]) for key in spec.keys],
        },
    )


def _key_status(spec: TenantSpec, key: KeySpec, key_id: str) -> dict[str, str]:
    status = {
        "name": key.name,
        "keyId": key_id,
        "secretName": key_secret_name(spec.tenant, key.name),
    }
    if key.certificate_subject is not None:
        status["certificateSubject"] = key.certificate_subject
    return status


async def _release_subjects(
    store: TenancyStore,
    spec: TenantSpec,
    kept: Mapping[str, KeySecret],
    ours: Mapping[str, str],
) -> set[str]:
    """Make the certificate subjects the spec wants free for the keys that want them;
    returns the ids of the keys whose subject was cleared.

    A live key holding a wanted subject is either this resource's (a key being
    replaced or dropped, or a kept one whose subject goes to another of its keys):
    its subject is cleared, so the key that wants it can claim it. Or it is not
    (another tenant's key, one made with the CLI): the spec is refused with
    :class:`CertificateSubjectTakenError` before any key is written.
    """
    wanted = {k.certificate_subject: k.name for k in spec.keys if k.certificate_subject}
    if not wanted:
        return set()
    holders = [
        (k, wanted[k.certificate_subject])
        for k in await store.list_keys()  # every tenant's: a subject is one principal
        if k.certificate_subject in wanted and not k.revoked
    ]
    for holder, name in holders:
        if holder.key_id not in ours:
            raise CertificateSubjectTakenError(
                f"spec.keys[{name}].certificateSubject: certificate subject"
                f" {holder.certificate_subject!r} already signs in as a key"
                " this Tenant does not manage"
            )
    kept_names = {held.key_id: name for name, held in kept.items()}
    released = set()
    for holder, name in holders:
        if kept_names.get(holder.key_id) != name:
            await store.set_certificate_subject(holder.key_id, None)
            released.add(holder.key_id)
    return released


async def _ensure_tenant(store: TenancyStore, spec: TenantSpec) -> None:
    tenant = await store.get_tenant(spec.tenant)
    if tenant is None:
        try:
            await store.create_tenant(Tenant(spec.tenant, _now_ms(), spec.quotas))
            return
        except TenancyError:
            # Created between our read and write (by another writer): update it instead.
            tenant = await store.require_tenant(spec.tenant)
    if tenant.quotas != spec.quotas:
        await store.set_quotas(spec.tenant, spec.quotas)


async def _usable(key: ApiKey | None, tenant: str, held: KeySecret) -> bool:
    if key is None or key.revoked or key.tenant != tenant:
        return False
    return await asyncio.to_thread(verify_secret, held.password, key.secret_hash)


async def _create_key(store: TenancyStore, spec: TenantSpec, key: KeySpec) -> tuple[str, str]:
    description = spec.marker(key.name) + (f" {key.description}" if key.description else "")
    minted = await asyncio.to_thread(mint_key, spec.tenant, description, _now_ms())
    new = dataclasses.replace(minted.key, certificate_subject=key.certificate_subject)
    key_id = new.key_id
    # Born with every binding the spec gives it, in one write: a gateway that sees
    # the key must not see it with its role's bindings but without its extra ACLs.
    declared = [acl.binding(spec.tenant, key_id) for acl in spec.acls if acl.key == key.name]
    await store.add_key(new, [*role_bindings(key.role, spec.tenant, key_id), *declared])
    return key_id, minted.secret


async def remove_tenant(store: TenancyStore, admin: ClusterAdmin, spec: TenantSpec) -> None:
    """Revoke every key of the tenant, delete its topics and consumer groups on the
    brokers, then its records.

    Keys go first, so nobody writes to a topic being deleted. A group whose
    members have not left yet fails the call (a retriable KafkaAdminError) with
    the keys revoked and the topics gone; calling again finishes the job. A call
    after a complete one finds nothing left and does nothing.
    """
    for key in await store.list_keys(spec.tenant):
        if not key.revoked:
            await store.revoke_key(key.key_id, _now_ms())
    namespace = Namespace(spec.tenant)
    topics = {p.topic for p in await admin.partitions() if namespace.owns(p.topic)}
    await admin.delete_topics(sorted(topics))
    groups = [g for g in await admin.consumer_groups() if namespace.owns(g)]
    await admin.delete_consumer_groups(groups)
    if await store.get_tenant(spec.tenant) is not None:
        await store.delete_tenant(spec.tenant)


def _now_ms() -> int:
    return int(time.time() * 1000)
