"""The operator's own Kubernetes calls: get, list, apply and delete, over aiohttp.

kopf watches and patches the resources it serves (Cluster, Topic, Tenant),
but has no public client for everything else the handlers touch: the
Cluster's StatefulSets, Services and Secrets, the broker pods the roller
restarts. The generated clients (``kubernetes``, ``kubernetes_asyncio``)
would bring a second credential path beside kopf's and tens of MB of models
for four verbs, so this module is hand-written: one aiohttp session built
from the same :class:`kopf.ConnectionInfo` kopf logs in with (see
:mod:`shoal.operator.handlers`), and a fixed table of the kinds the operator
touches instead of API discovery.

``apply`` is a JSON merge-patch of the whole manifest (POST when the object
does not exist yet, PATCH again when someone created it in between). A
merge-patch never removes a field the manifest no longer sets; the builders
always set every field they own, so that does not matter here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import aiohttp
import kopf


class KindInfo(NamedTuple):
    plural: str
    namespaced: bool


KINDS: Final[Mapping[tuple[str, str], KindInfo]] = {
    ("v1", "ConfigMap"): KindInfo("configmaps", True),
    ("v1", "Secret"): KindInfo("secrets", True),
    ("v1", "Service"): KindInfo("services", True),
    ("v1", "Pod"): KindInfo("pods", True),
    ("v1", "PersistentVolumeClaim"): KindInfo("persistentvolumeclaims", True),
    ("v1", "ServiceAccount"): KindInfo("serviceaccounts", True),
    ("v1", "Namespace"): KindInfo("namespaces", False),
    ("apps/v1", "StatefulSet"): KindInfo("statefulsets", True),
    ("apps/v1", "Deployment"): KindInfo("deployments", True),
    ("policy/v1", "PodDisruptionBudget"): KindInfo("poddisruptionbudgets", True),
    ("networking.k8s.io/v1", "NetworkPolicy"): KindInfo("networkpolicies", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): KindInfo("clusterrolebindings", False),
    ("shoal.dev/v1alpha1", "Cluster"): KindInfo("clusters", True),
    ("shoal.dev/v1alpha1", "Topic"): KindInfo("topics", True),
    ("shoal.dev/v1alpha1", "Tenant"): KindInfo("tenants", True),
}
"""(apiVersion, kind) -> URL plural and scope, for every kind the operator reads or writes."""

MERGE_PATCH: Final = "application/merge-patch+json"
TIMEOUT_S: Final = 30.0
DELETE_OPTIONS: Final = {
    "kind": "DeleteOptions",
    "apiVersion": "v1",
    "propagationPolicy": "Background",
}
"""Dependents (a StatefulSet's pods, a Tenant's Secrets) go after their owner, not before."""


class KubeError(Exception):
    """The API server refused a request; ``status`` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API {status}: {message}")
        self.status = status
        self.message = message


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None) -> str:
    """The API path of one object (``name`` given) or of a collection.

    A namespaced kind without a namespace is the collection across all
    namespaces (lists only).
    """
    try:
        info = KINDS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not handle {kind} ({api_version})") from None
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if info.namespaced and namespace else ""
    if not info.namespaced and namespace:
        raise ValueError(f"{kind} is cluster-scoped; got namespace {namespace!r}")
    suffix = f"/{name}" if name else ""
    return f"{root}{scope}/{info.plural}{suffix}"


class KubeClient:
    """The four verbs the handlers need, with kopf's credentials.

    Use as an async context manager, or call :meth:`close`.
    """

    def __init__(self, connection: kopf.ConnectionInfo, timeout_s: float = TIMEOUT_S) -> None:
        self.server = connection.server.rstrip("/")
        self.default_namespace = connection.default_namespace
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=connection.as_ssl_context()),
            headers={**connection.as_http_headers(), "User-Agent": "shoal-operator"},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        )

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        async with self._session.request(
            method,
            f"{self.server}{path}",
            json=body,
            params=params,
            headers={"Content-Type": content_type} if body is not None else None,
        ) as response:
            try:
                payload = await response.json(content_type=None)
            except ValueError:
                payload = None
            if response.status >= 400:
                message = (
                    payload.get("message", response.reason)
                    if isinstance(payload, dict)
                    else response.reason
                )
                raise KubeError(response.status, str(message))
            return payload if isinstance(payload, dict) else {}

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self._request("GET", resource_path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        listing = await self._request(
            "GET", resource_path(api_version, kind, namespace, None), params=params
        )
        items: list[dict[str, Any]] = listing.get("items") or []
        return items

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Make the object match ``manifest`` (merge-patch, or create); returns the object."""
        api_version, kind = manifest["apiVersion"], manifest["kind"]
        metadata = manifest["metadata"]
        namespace, name = metadata.get("namespace"), metadata["name"]
        path = resource_path(api_version, kind, namespace, name)
        try:
            return await self._request("PATCH", path, body=manifest, content_type=MERGE_PATCH)
        except KubeError as exc:
            if exc.status != 404:
                raise
        try:
            return await self._request(
                "POST", resource_path(api_version, kind, namespace, None), body=manifest
            )
        except KubeError as exc:
            if exc.status != 409:
                raise
        # Created by someone else between our PATCH and POST: patch theirs.
        return await self._request("PATCH", path, body=manifest, content_type=MERGE_PATCH)

    async def patch_status(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        status: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Merge-patch the status subresource (None values remove fields)."""
        path = resource_path(api_version, kind, namespace, name) + "/status"
        return await self._request("PATCH", path, body={"status": status}, content_type=MERGE_PATCH)

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """Delete the object (its dependents in the background); False when already gone."""
        try:
            await self._request(
                "DELETE",
                resource_path(api_version, kind, namespace, name),
                body={
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "propagationPolicy": "Background",
                },
            )
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True
