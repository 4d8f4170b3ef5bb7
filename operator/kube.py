"""The operator's own Kubernetes calls: get, list, server-side apply, status and delete.

kopf watches and patches the resources it serves (Cluster, Topic, Tenant),
but has no public client for everything else the handlers touch: the
Cluster's StatefulSets, Services and Secrets, the broker pods the roller
restarts. :class:`KubeClient` is a thin dict-in, dict-out adapter over
lightkube's :class:`lightkube.AsyncClient`, so handlers and builders keep
speaking plain manifests and :class:`KubeError` while lightkube does the
requests.

**Why lightkube.** It is maintained, asyncio-native, typed for mypy (a
class per built-in kind; our three CRDs are generic resources of group
``shoal.dev``), and server-side apply with a field manager is one call. The
``kubernetes`` package is synchronous; its asyncio sibling
(``kubernetes_asyncio``) is a large generated client whose server-side apply
is a hand-made PATCH with content types and query parameters of one's own.

**One credential path.** :func:`kube_config` turns the
:class:`kopf.ConnectionInfo` kopf logs in with (the pod's service account, else
the kubeconfig; see :mod:`shoal.operator.handlers`) into lightkube's
configuration: the same server, CA, token or client certificate. When kopf
logs in again (an expired token), the login handler builds a new client.

**Server-side apply.** :meth:`KubeClient.apply` sends the whole manifest as an
apply patch with field manager ``shoal-operator``. The API server then keeps,
per manager, the set of fields each one applied: a field the operator applied
last time and not now is removed (the rack init container once ``rackLabel``
is gone, a ConfigMap key of a dropped broker setting; the JSON merge patch
used before replaced lists whole but never removed a key the manifest
stopped setting), and fields other managers set (a label added with
``kubectl label``, an annotation from a service mesh) stay.

**Objects the merge-patch client wrote** carry its fields under a manager of
the same name with operation Update (the API server names a manager after
the User-Agent, which was ``shoal-operator``). Fields an Update entry owns
are never removed by an apply, so the first apply of such an object hands
them to the Apply entry, as ``kubectl`` does when it moves an object from
client-side to server-side apply (a JSON patch of ``managedFields``, guarded
by the resourceVersion), and applies again, which removes what the builders
no longer make. Later applies find no such entry and cost nothing extra.

**Conflicts are forced.** The operator owns the fields it sets, as every
controller does: a human's ``kubectl edit`` of one of them is reverted on the
next reconcile, as the Deployment controller reverts an edit of its
ReplicaSets. Not forcing would leave the reconcile failing on a 409 until
someone released the field by hand. So that a takeover is seen, the first
attempt is not forced: the 409 names each conflicting field and its manager,
which is logged at INFO, and the apply is repeated with ``force``. That costs
a second request only when someone else has claimed one of our fields.

**Status is a merge patch** of the status subresource, not an apply. The
handlers write a status in parts (the Cluster's conditions while it rolls,
everything at the end) and remove a field by writing None (``lastError``); an
apply replaces what the manager applied before, so each part would remove the
others. Only the operator writes these statuses: there is no ownership to
settle. The merge patch carries the same field manager (operation Update).

Manifests are sent as the builders' dicts, not converted into lightkube's
models first: a model drops a field it does not know, and in an apply a
dropped field is a removed one. Answers are turned back into plain dicts.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final, Protocol, cast

import httpx2
import kopf
from lightkube import AsyncClient, KubeConfig, LoadResourceError
from lightkube.config.models import Cluster, User
from lightkube.core.client import LabelSelector
from lightkube.core.resource import NamespacedResource
from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import GenericNamespacedResource, create_namespaced_resource
from lightkube.types import CascadeType, PatchType

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "shoal-operator"
"""The manager the API server records for every field the operator applies."""
TIMEOUT_S: Final = 30.0
ALL_NAMESPACES: Final = "*"
"""lightkube's namespace for a list across every namespace."""

GROUP: Final = "shoal.dev"
VERSION: Final = "v1alpha1"
CUSTOM_KINDS: Final[Mapping[str, type[GenericNamespacedResource]]] = {
    kind: create_namespaced_resource(GROUP, VERSION, kind, plural)
    for kind, plural in (("Cluster", "clusters"), ("Topic", "topics"), ("Tenant", "tenants"))
}
"""Our CRDs (``k8s/crds``), registered with lightkube; built-in kinds it knows already."""

_CONFLICT_MANAGER = re.compile(r'conflict with "([^"]*)"')


UNREACHABLE: Final = 503
"""The status a :class:`KubeError` carries when no answer came (connection refused, reset)."""
TRANSIENT_STATUSES: Final = frozenset({409, 429, 500, 502, 503, 504})
"""Answers that a later attempt may not get: conflicts, throttling, a server (re)starting."""


class KubeError(Exception):
    """The API server refused a request, or could not be reached; ``status`` is the HTTP status.

    ``body`` is the server's Status object (empty when it sent none). A
    request that got no answer at all (the API server restarting) has status
    :data:`UNREACHABLE`.
    """

    def __init__(self, status: int, message: str, body: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"Kubernetes API {status}: {message}")
        self.status = status
        self.message = message
        self.body: Mapping[str, Any] = body or {}

    @property
    def transient(self) -> bool:
        """Worth retrying soon: see :data:`TRANSIENT_STATUSES`."""
        return self.status in TRANSIENT_STATUSES


class _Decoded(Protocol):
    """What lightkube answers with: a typed model or a generic resource, both with ``to_dict``."""

    def to_dict(self) -> dict[str, Any]: ...


def _pem_base64(data: str | bytes | None) -> str | None:
    """kopf takes PEM or base64 for certificate data; lightkube takes base64."""
    if data is None:
        return None
    text = data.decode("ascii") if isinstance(data, bytes) else data
    if text.startswith("-----BEGIN "):
        return base64.b64encode(text.encode("ascii")).decode("ascii")
    return text


def _absolute(path: str | bytes | os.PathLike[str] | os.PathLike[bytes] | None) -> str | None:
    """kopf opens relative paths from the working directory; lightkube wants them absolute."""
    return None if path is None else os.path.abspath(os.fsdecode(path))


def kube_config(connection: kopf.ConnectionInfo) -> KubeConfig:
    """lightkube's configuration for the server and credentials kopf logged in with."""
    if connection.scheme and connection.scheme.lower() != "bearer":
        raise ValueError(f"unsupported authorization scheme {connection.scheme!r}")
    if connection.insecure:
        # lightkube verifies against a CA whenever one is given; kopf skips verification.
        cluster = Cluster(server=connection.server, insecure=True)
    else:
        cluster = Cluster(
            server=connection.server,
            certificate_auth=_absolute(connection.ca_path),
            certificate_auth_data=_pem_base64(connection.ca_data),
        )
    user = User(
        token=connection.token,
        username=connection.username,
        password=connection.password,
        client_cert=_absolute(connection.certificate_path),
        client_cert_data=_pem_base64(connection.certificate_data),
        client_key=_absolute(connection.private_key_path),
        client_key_data=_pem_base64(connection.private_key_data),
    )
    return KubeConfig.from_one(cluster=cluster, user=user, namespace=connection.default_namespace)


def _resource(api_version: str, kind: str) -> type[Any]:
    """lightkube's class for a kind: built-in, or one of :data:`CUSTOM_KINDS`."""
    try:
        return resource_registry.load(api_version, kind)
    except LoadResourceError:
        raise ValueError(f"the operator does not handle {kind} ({api_version})") from None


def _equality_selector(selector: str | None) -> LabelSelector | None:
    """``a=b,c=d`` as lightkube's label selector; the operator selects by equality only."""
    if not selector:
        return None
    labels: LabelSelector = {}
    for term in selector.split(","):
        key, sep, value = term.partition("=")
        value = value.removeprefix("=")  # a==b means a=b
        if not sep or key.endswith("!"):
            raise ValueError(f"not an equality selector term: {term!r}")
        labels[key.strip()] = value.strip()
    return labels


@contextlib.contextmanager
def _api_errors() -> Iterator[None]:
    """lightkube's HTTP errors as :class:`KubeError`, so handlers need not know lightkube."""
    try:
        yield
    except httpx2.HTTPStatusError as exc:
        # lightkube makes an ApiError only of answers typed exactly application/json;
        # read the Status from the body either way.
        response = exc.response
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {}
        message = str(body.get("message") or response.reason_phrase)
        raise KubeError(response.status_code, message, body) from exc
    except httpx2.TransportError as exc:
        # No answer: refused, reset or timed out (an API server restarting).
        raise KubeError(UNREACHABLE, f"no answer from the API server: {exc!r}") from exc


def _conflicts(error: KubeError) -> str:
    """``manager:field`` of each field an apply conflicted on, comma-separated."""
    causes = (error.body.get("details") or {}).get("causes") or []
    found = []
    for cause in causes:
        matched = _CONFLICT_MANAGER.search(str(cause.get("message", "")))
        manager = matched.group(1) if matched else "?"
        found.append(f"{manager}:{cause.get('field', '?')}")
    return ",".join(found) or error.message


def _entries(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(e) for e in obj.get("metadata", {}).get("managedFields") or []]


def _version(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


def _ours(entry: Mapping[str, Any], operation: str) -> bool:
    """An entry of ``shoal-operator`` for the object itself (not its status)."""
    return (
        entry.get("manager") == FIELD_MANAGER
        and entry.get("operation") == operation
        and not entry.get("subresource")
    )


def _written_by_merge_patch_client(entry: Mapping[str, Any]) -> bool:
    """Ours, but an Update owning fields: left by the client before server-side apply."""
    return _ours(entry, "Update") and bool(entry.get("fieldsV1"))


def _union(tree: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    """Two managedFields ``fieldsV1`` trees as one: every field either names."""
    merged = dict(tree)
    for key, value in other.items():
        mine = merged.get(key)
        if isinstance(mine, Mapping) and isinstance(value, Mapping):
            merged[key] = _union(mine, value)
        else:
            merged[key] = value
    return merged


class KubeClient:
    """get, list, apply, patch_status and delete, dicts in and out, with kopf's credentials.

    Use as an async context manager, or call :meth:`close`.
    """

    def __init__(self, connection: kopf.ConnectionInfo, timeout_s: float = TIMEOUT_S) -> None:
        self._client = AsyncClient(
            kube_config(connection),
            timeout=httpx2.Timeout(timeout_s),
            field_manager=FIELD_MANAGER,
            trust_env=connection.trust_env,
            proxy=connection.proxy_url,
        )

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        resource = _resource(api_version, kind)
        try:
            with _api_errors():
                found = await self._client.get(resource, name, namespace=namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return cast(_Decoded, found).to_dict()

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Objects of a kind in ``namespace`` (a namespaced kind: every namespace when None)."""
        resource = _resource(api_version, kind)
        if namespace is None and issubclass(resource, NamespacedResource):
            namespace = ALL_NAMESPACES
        listing = self._client.list(
            resource, namespace=namespace, labels=_equality_selector(label_selector)
        )
        with _api_errors():
            return [cast(_Decoded, found).to_dict() async for found in listing]

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply ``manifest`` as ``shoal-operator``, forcing; returns the object.

        Creates the object when it does not exist. See the module's docstring
        for why conflicts are forced and logged, and how the fields of objects
        the merge-patch client wrote are adopted.
        """
        applied = await self._apply_forcing(manifest)
        if not any(_written_by_merge_patch_client(e) for e in _entries(applied)):
            return applied
        if not await self._adopt(manifest, applied):
            return applied  # written meanwhile: the next reconcile adopts
        return await self._apply(manifest, force=True)

    async def _apply_forcing(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Apply without force, and with force (logged) when fields of others were in the way."""
        kind = manifest["kind"]
        metadata = manifest["metadata"]
        namespace, name = metadata.get("namespace"), metadata["name"]
        try:
            return await self._apply(manifest, force=False)
        except KubeError as exc:
            if exc.status != 409:
                raise
            log.info(
                "event=apply_took_over_fields kind=%s namespace=%s name=%s fields=%s",
                kind,
                namespace,
                name,
                _conflicts(exc),
            )
        return await self._apply(manifest, force=True)

    async def _adopt(self, manifest: Mapping[str, Any], applied: Mapping[str, Any]) -> bool:
        """Hand the merge-patch client's fields to our Apply entry; False if the object changed."""
        entries = _entries(applied)
        legacy = [e for e in entries if _written_by_merge_patch_client(e)]
        kept = [e for e in entries if not _written_by_merge_patch_client(e)]
        for entry in kept:
            if _ours(entry, "Apply"):
                for old in legacy:
                    entry["fieldsV1"] = _union(
                        entry.get("fieldsV1") or {}, old.get("fieldsV1") or {}
                    )
        guarded = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": _version(applied)},
            {"op": "replace", "path": "/metadata/managedFields", "value": kept},
        ]
        resource = _resource(manifest["apiVersion"], manifest["kind"])
        metadata = manifest["metadata"]
        try:
            with _api_errors():
                await self._client.patch(
                    resource,
                    metadata["name"],
                    guarded,
                    namespace=metadata.get("namespace"),
                    patch_type=PatchType.JSON,
                )
        except KubeError as exc:
            if exc.status not in (409, 422):  # 422: the resourceVersion test failed
                raise
            return False
        log.info(
            "event=apply_adopted_merge_patch_fields kind=%s namespace=%s name=%s",
            manifest["kind"],
            metadata.get("namespace"),
            metadata["name"],
        )
        return True

    async def _apply(self, manifest: Mapping[str, Any], force: bool) -> dict[str, Any]:
        resource = _resource(manifest["apiVersion"], manifest["kind"])
        metadata = manifest["metadata"]
        with _api_errors():
            applied = await self._client.patch(
                resource,
                metadata["name"],
                dict(manifest),
                namespace=metadata.get("namespace"),
                patch_type=PatchType.APPLY,
                force=force,
            )
        return cast(_Decoded, applied).to_dict()

    async def patch_status(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        status: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Merge-patch the status subresource of a Shoal resource (None values remove fields)."""
        if api_version != f"{GROUP}/{VERSION}" or kind not in CUSTOM_KINDS:
            raise ValueError(f"the operator writes the status of Shoal kinds only, not {kind}")
        with _api_errors():
            patched = await self._client.patch(
                CUSTOM_KINDS[kind].Status,
                name,
                {"status": dict(status)},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        return cast(_Decoded, patched).to_dict()

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """Delete the object (its dependents in the background); False when already gone.

        Background: dependents (a StatefulSet's pods, a Tenant's Secrets) go
        after their owner, not before.
        """
        resource = _resource(api_version, kind)
        try:
            with _api_errors():
                await self._client.delete(
                    resource, name, namespace=namespace, cascade=CascadeType.BACKGROUND
                )
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True
