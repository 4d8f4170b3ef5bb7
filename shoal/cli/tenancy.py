"""``shoal tenant``, ``shoal key``, ``shoal acl``, ``shoal quota``: the platform admin's tools.

They write the tenancy records in etcd (``--etcd`` / ``SHOAL_ETCD``, the
same URL and chroot the brokers use). Everything that shows or creates
something takes ``-o json`` for scripts. A key's secret is printed once, by
``shoal key create``, and is never stored or shown again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from shoal.cli.admin import admin_client, cluster_metadata, wait
from shoal.cli.client import OutputOption, PropertyOption
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
from shoal.tenancy.store import TenancyStore, TenancyStoreError

T = TypeVar("T")

EtcdOption = Annotated[
    str,
    typer.Option(
        envvar="SHOAL_ETCD", help="etcd URL with the cluster's chroot: http://host:2379/shoal."
    ),
]

tenant_app = typer.Typer(help="Create, list, describe and delete tenants.", no_args_is_help=True)
key_app = typer.Typer(help="Create, list and revoke a tenant's API keys.", no_args_is_help=True)
acl_app = typer.Typer(help="Add, list and remove a tenant's ACL bindings.", no_args_is_help=True)
quota_app = typer.Typer(help="Set and show a tenant's quotas.", no_args_is_help=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _run(etcd: str, action: Callable[[TenancyStore], Awaitable[T]]) -> T:
    """Run ``action`` against the store; refusals and an unreachable etcd end in one line."""

    async def go() -> T:
        async with TenancyStore(etcd) as store:
            return await action(store)

    try:
        return asyncio.run(go())
    except (TenancyError, TenancyStoreError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


def _emit(output: str, data: Any, table: Table | None = None, text: str | None = None) -> None:
    if output == "json":
        typer.echo(json.dumps(data, indent=2))
    elif table is not None:
        Console().print(table)
    elif text is not None:
        typer.echo(text)


def _tenant_data(tenant: Tenant) -> dict[str, Any]:
    return {"name": tenant.name, "created_ms": tenant.created_ms, "quotas": asdict(tenant.quotas)}


def _key_data(key: ApiKey) -> dict[str, Any]:
    """Everything about a key except its hash."""
    return {
        "key_id": key.key_id,
        "tenant": key.tenant,
        "description": key.description,
        "created_ms": key.created_ms,
        "revoked": key.revoked,
        "platform_admin": key.platform_admin,
        # Which keys can sign in with SCRAM; those made before it existed need rotating.
        "scram_mechanisms": [c.mechanism.value for c in key.scram],
        "certificate_subject": key.certificate_subject,
    }


# -- tenants --------------------------------------------------------------------------


@tenant_app.command("create")
def tenant_create(name: str, etcd: EtcdOption, output: OutputOption = "table") -> None:
    """Create a tenant (no keys yet: see ``shoal key create``)."""

    async def create(store: TenancyStore) -> Tenant:
        tenant = Tenant(validate_tenant_name(name), _now_ms())
        await store.create_tenant(tenant)
        return tenant

    tenant = _run(etcd, create)
    _emit(output, _tenant_data(tenant), text=f"created tenant {name}")


@tenant_app.command("list")
def tenant_list(etcd: EtcdOption, output: OutputOption = "table") -> None:
    """Every tenant, with its quotas."""
    tenants = _run(etcd, lambda store: store.list_tenants())
    table = Table("tenant", "produce B/s", "consume B/s", "max partitions")
    for t in tenants:
        q = t.quotas
        table.add_row(
            t.name,
            _limit(q.producer_byte_rate),
            _limit(q.consumer_byte_rate),
            _limit(q.max_partitions),
        )
    _emit(output, [_tenant_data(t) for t in tenants], table)


def _limit(value: float | None) -> str:
    # Whole numbers in full: a byte count of 10737418240 is not "1.07374e+10".
    if value is None:
        return "unlimited"
    return str(value) if isinstance(value, int) else f"{value:g}"


@tenant_app.command("describe")
def tenant_describe(name: str, etcd: EtcdOption, output: OutputOption = "table") -> None:
    """A tenant's quotas, keys (never their secrets) and ACL bindings."""

    async def gather(store: TenancyStore) -> tuple[Tenant, list[ApiKey], list[AclBinding]]:
        return (
            await store.require_tenant(name),
            await store.list_keys(name),
            await store.list_bindings(name),
        )

    tenant, keys, bindings = _run(etcd, gather)
    data = {
        **_tenant_data(tenant),
        "keys": [_key_data(k) for k in keys],
        "acls": [b.to_dict() for b in bindings],
    }
    if output == "json":
        _emit(output, data)
        return
    console = Console()
    console.print(f"[bold]{tenant.name}[/bold]")
    console.print(_keys_table(keys))
    console.print(_acls_table(bindings))


@tenant_app.command("delete")
def tenant_delete(
    name: str,
    etcd: EtcdOption,
    brokers: Annotated[
        str | None,
        typer.Option(
            "--brokers",
            envvar="SHOAL_BROKERS",
            help="The brokers' internal listeners (not the gateway: tenants cannot see"
            " each other's topics, and this must).",
        ),
    ] = None,
    brokers_config: Annotated[
        Path | None,
        typer.Option(
            help="librdkafka properties for the internal listeners, if they need any.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    properties: PropertyOption = None,
) -> None:
    """Delete a tenant: its topics and groups on the brokers, then its keys and bindings."""
    _run(etcd, lambda store: store.require_tenant(name))
    topics, groups = _delete_broker_resources(name, brokers, brokers_config, properties)
    keys = _run(etcd, lambda store: store.delete_tenant(name))
    typer.echo(f"deleted tenant {name}: {topics} topics, {groups} groups, {len(keys)} keys revoked")


def _delete_broker_resources(
    tenant: str, bootstrap: str | None, config_file: Path | None, properties: list[str] | None
) -> tuple[int, int]:
    """Delete ``<tenant>.*`` topics and groups on the brokers; (topics, groups) deleted."""
    prefix = f"{tenant}."
    admin = admin_client(bootstrap, config_file, properties)
    topics = [t for t in cluster_metadata(admin).topics if t.startswith(prefix)]
    if topics:
        for future in admin.delete_topics(topics).values():
            wait(future)
    listed = wait(admin.list_consumer_groups())
    groups = [g.group_id for g in listed.valid if g.group_id.startswith(prefix)]
    if groups:
        for future in admin.delete_consumer_groups(groups).values():
            wait(future)
    return len(topics), len(groups)


# -- keys -----------------------------------------------------------------------------


@key_app.command("create")
def key_create(
    tenant: str,
    etcd: EtcdOption,
    description: Annotated[str, typer.Option(help="What the key is for.")] = "",
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Read and describe only, no writes.")
    ] = False,
    no_acls: Annotated[
        bool,
        typer.Option("--no-acls", help="No bindings at all: grant them with `shoal acl add`."),
    ] = False,
    platform_admin: Annotated[
        bool,
        typer.Option(
            "--platform-admin",
            help="May also read and set every tenant's quotas with Kafka's client-quota APIs.",
        ),
    ] = False,
    certificate_subject: Annotated[str | None, typer.Option(help=_CERTIFICATE_SUBJECT_HELP)] = None,
    output: OutputOption = "table",
) -> None:
    """Create an API key. Its secret is shown now and never again."""
    subject = None if certificate_subject is None else _subject(certificate_subject)
    minted = mint_key(tenant, description, _now_ms(), platform_admin=platform_admin)
    key = replace(minted.key, certificate_subject=subject)
    secret, key_id = minted.secret, key.key_id
    role = KeyRole.NONE if no_acls else KeyRole.READ_ONLY if read_only else KeyRole.DEFAULT
    bindings = role_bindings(role, tenant, key_id)
    _run(etcd, lambda store: store.add_key(key, bindings))
    data = {**_key_data(key), "secret": secret, "acls": [b.to_dict() for b in bindings]}
    _emit(
        output,
        data,
        text=f"key_id  {key_id}\nsecret  {secret}\n(store the secret now: it is not shown again)",
    )


@key_app.command("list")
def key_list(
    etcd: EtcdOption,
    tenant: Annotated[str | None, typer.Argument(help="Only this tenant's keys.")] = None,
    output: OutputOption = "table",
) -> None:
    """Keys (ids, never secrets), of one tenant or all."""
    keys = _run(etcd, lambda store: store.list_keys(tenant))
    _emit(output, [_key_data(k) for k in keys], _keys_table(keys))


def _keys_table(keys: list[ApiKey]) -> Table:
    table = Table("key id", "tenant", "description", "certificate subject", "revoked")
    for k in keys:
        table.add_row(
            k.key_id,
            k.tenant,
            k.description,
            k.certificate_subject or "",
            "yes" if k.revoked else "",
        )
    return table


_CERTIFICATE_SUBJECT_HELP = (
    "Clients whose certificate (from the gateway's --tls-client-ca) has this subject,"
    " e.g. 'CN=orders,O=acme', sign in as the key on the mutual-TLS listener."
)


def _subject(text: str) -> str:
    try:
        return canonical_subject(text)
    except TenancyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


@key_app.command("certificate")
def key_certificate(
    key_id: str,
    etcd: EtcdOption,
    subject: Annotated[
        str | None, typer.Argument(help=_CERTIFICATE_SUBJECT_HELP + " Omit it to clear.")
    ] = None,
    output: OutputOption = "table",
) -> None:
    """Let client certificates of SUBJECT sign in as the key (mutual TLS), or none."""
    canonical = None if subject is None else _subject(subject)
    key = _run(etcd, lambda store: store.set_certificate_subject(key_id, canonical))
    _emit(
        output,
        _key_data(key),
        text=(
            f"certificates of {canonical} sign in as key {key_id}"
            if canonical
            else f"no certificate signs in as key {key_id}"
        ),
    )


@key_app.command("revoke")
def key_revoke(key_id: str, etcd: EtcdOption, output: OutputOption = "table") -> None:
    """Revoke a key: it no longer authenticates."""
    key = _run(etcd, lambda store: store.revoke_key(key_id, _now_ms()))
    _emit(output, _key_data(key), text=f"revoked key {key_id}")


# -- ACL bindings -------------------------------------------------------------------------

ResourceOption = Annotated[
    str, typer.Option("--resource-type", "-r", help="topic, group, transactional-id or cluster.")
]
NameOption = Annotated[str, typer.Option("--name", "-n", help="Resource name, or * for all.")]
OperationOption = Annotated[
    str,
    typer.Option(
        "--operation",
        help="all, read, write, create, delete, alter, describe, describe-configs,"
        " alter-configs, idempotent-write.",
    ),
]
PrincipalOption = Annotated[
    str, typer.Option("--principal", help="Key id, or * for every key of the tenant.")
]
PrefixedOption = Annotated[
    bool, typer.Option("--prefixed", help="The name is a prefix (PREFIXED pattern).")
]
DenyOption = Annotated[bool, typer.Option("--deny", help="A DENY binding (deny wins).")]


def _binding(
    tenant: str,
    principal: str,
    resource_type: str,
    name: str,
    operation: str,
    prefixed: bool,
    deny: bool,
) -> AclBinding:
    try:
        return AclBinding(
            tenant,
            principal,
            ResourceType[resource_type.upper().replace("-", "_")],
            PatternType.PREFIXED if prefixed else PatternType.LITERAL,
            name,
            Operation[operation.upper().replace("-", "_")],
            Permission.DENY if deny else Permission.ALLOW,
        )
    except KeyError as exc:
        typer.echo(f"error: unknown resource type or operation {exc}", err=True)
        raise typer.Exit(1) from exc
    except TenancyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


@acl_app.command("add")
def acl_add(
    tenant: str,
    etcd: EtcdOption,
    resource_type: ResourceOption,
    operation: OperationOption,
    name: NameOption = WILDCARD,
    principal: PrincipalOption = WILDCARD,
    prefixed: PrefixedOption = False,
    deny: DenyOption = False,
    output: OutputOption = "table",
) -> None:
    """Add a binding: names are the tenant's own (``orders``), never another tenant's."""
    binding = _binding(tenant, principal, resource_type, name, operation, prefixed, deny)
    _run(etcd, lambda store: store.add_binding(binding))
    _emit(output, binding.to_dict(), text="added " + _describe(binding))


@acl_app.command("remove")
def acl_remove(
    tenant: str,
    etcd: EtcdOption,
    resource_type: ResourceOption,
    operation: OperationOption,
    name: NameOption = WILDCARD,
    principal: PrincipalOption = WILDCARD,
    prefixed: PrefixedOption = False,
    deny: DenyOption = False,
) -> None:
    """Remove a binding, given exactly as it was added (whether declared or made by the
    tenant with Kafka's CreateAcls: the platform may remove either)."""
    binding = _binding(tenant, principal, resource_type, name, operation, prefixed, deny)

    async def remove(store: TenancyStore) -> bool:
        removed = [await store.remove_binding(replace(binding, source=s)) for s in BindingSource]
        return any(removed)

    if not _run(etcd, remove):
        typer.echo(f"error: no such binding: {_describe(binding)}", err=True)
        raise typer.Exit(1)
    typer.echo("removed " + _describe(binding))


@acl_app.command("list")
def acl_list(tenant: str, etcd: EtcdOption, output: OutputOption = "table") -> None:
    """A tenant's bindings."""
    bindings = _run(etcd, lambda store: store.list_bindings(tenant))
    _emit(output, [b.to_dict() for b in bindings], _acls_table(bindings))


def _describe(b: AclBinding) -> str:
    pattern = "prefixed" if b.pattern_type is PatternType.PREFIXED else "literal"
    return (
        f"{b.permission.name} {b.principal} {b.operation.name} on"
        f" {b.resource_type.name} {pattern} {b.resource_name!r}"
    )


def _acls_table(bindings: list[AclBinding]) -> Table:
    table = Table("principal", "permission", "operation", "resource", "pattern", "name", "source")
    for b in bindings:
        table.add_row(
            b.principal,
            b.permission.name,
            b.operation.name,
            b.resource_type.name,
            b.pattern_type.name,
            b.resource_name,
            b.source.value,
        )
    return table


# -- quotas ---------------------------------------------------------------------------


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter("must be greater than 0")
    return value


@quota_app.command("set")
def quota_set(
    tenant: str,
    etcd: EtcdOption,
    producer_byte_rate: Annotated[
        float | None, typer.Option(help="Produce bytes/s over the whole tenant.", min=1)
    ] = None,
    consumer_byte_rate: Annotated[
        float | None, typer.Option(help="Consume bytes/s over the whole tenant.", min=1)
    ] = None,
    max_partitions: Annotated[
        int | None, typer.Option(help="Most partitions over all the tenant's topics.", min=0)
    ] = None,
    max_connections: Annotated[
        int | None,
        typer.Option(help="Most open Kafka connections over all gateway replicas.", min=1),
    ] = None,
    controller_mutation_rate: Annotated[
        float | None,
        typer.Option(
            help="Partitions/s the tenant may create or delete (Kafka's KIP-599 quota).",
            callback=_positive,
        ),
    ] = None,
    max_storage_bytes: Annotated[
        int | None,
        typer.Option(
            help="Bytes the tenant's data may take (leader replicas); past it, produce is refused.",
            min=1,
        ),
    ] = None,
    max_connection_rate: Annotated[
        float | None,
        typer.Option(
            help="Kafka connections/s the tenant may open over all gateway replicas"
            " (Kafka's KIP-612 connection_creation_rate); faster logins are held.",
            callback=_positive,
        ),
    ] = None,
    request_percentage: Annotated[
        float | None,
        typer.Option(
            help="Percent of one request thread's time the tenant's requests may take over all"
            " gateway replicas (Kafka's request_percentage; above 100 is several threads);"
            " past it, answers are throttled.",
            callback=_positive,
        ),
    ] = None,
    clear: Annotated[bool, typer.Option(help="Remove every limit first.")] = False,
    output: OutputOption = "table",
) -> None:
    """Set a tenant's limits; those not given keep their value (unless --clear)."""

    async def update(store: TenancyStore) -> Tenant:
        current = Quotas() if clear else (await store.require_tenant(tenant)).quotas
        quotas = Quotas(
            producer_byte_rate if producer_byte_rate is not None else current.producer_byte_rate,
            consumer_byte_rate if consumer_byte_rate is not None else current.consumer_byte_rate,
            max_partitions if max_partitions is not None else current.max_partitions,
            max_connections if max_connections is not None else current.max_connections,
            controller_mutation_rate
            if controller_mutation_rate is not None
            else current.controller_mutation_rate,
            max_storage_bytes if max_storage_bytes is not None else current.max_storage_bytes,
            max_connection_rate if max_connection_rate is not None else current.max_connection_rate,
            request_percentage if request_percentage is not None else current.request_percentage,
        )
        return await store.set_quotas(tenant, quotas)

    updated = _run(etcd, update)
    _emit(output, _tenant_data(updated), text=f"quotas of {tenant}: {asdict(updated.quotas)}")


@quota_app.command("show")
def quota_show(tenant: str, etcd: EtcdOption, output: OutputOption = "table") -> None:
    """A tenant's limits."""
    found = _run(etcd, lambda store: store.require_tenant(tenant))
    q = found.quotas
    table = Table("limit", "value")
    table.add_row("produce bytes/s", _limit(q.producer_byte_rate))
    table.add_row("consume bytes/s", _limit(q.consumer_byte_rate))
    table.add_row("max partitions", _limit(q.max_partitions))
    table.add_row("max connections", _limit(q.max_connections))
    table.add_row("controller mutations/s", _limit(q.controller_mutation_rate))
    table.add_row("max storage bytes", _limit(q.max_storage_bytes))
    table.add_row("connections/s", _limit(q.max_connection_rate))
    table.add_row("request time %", _limit(q.request_percentage))
    _emit(output, {"tenant": tenant, **asdict(q)}, table)
