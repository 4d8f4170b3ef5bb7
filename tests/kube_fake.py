"""A fake Kubernetes API for the operator's tests: kmock's emulator plus a small shim.

No Kubernetes API server can run here (../shared/DESIGN.md), so kopf and
:class:`shoal.operator.kube.KubeClient` talk to kmock's
:class:`~kmock.KubernetesEmulator` (pinned: 0.8) over real HTTP. It serves
API discovery, list, watch streams (ADDED/MODIFIED/DELETED), get, create
(409 when the object exists), merge-patch, delete, 404s, and finalizers
(DELETE of an object with finalizers sets deletionTimestamp; the object goes
once they are empty). :class:`FakeKubeApi` adds what kopf and our handlers
rely on and kmock 0.8 does not do:

* ``metadata.resourceVersion`` on every write (kopf waits for the version
  its own patch produced to come back through the watch stream), and
  ``uid``, ``creationTimestamp`` and ``generation`` (bumped when anything but
  metadata and status changes) as the API server sets them;
* the ``/status`` subresource: a PATCH there changes only ``status``, and a
  PATCH of the object leaves ``status`` alone, for kinds that have one;
* JSON-patch (``application/json-patch+json``, with ``test`` ops): kopf adds
  and removes its finalizers that way; a failed test is a 422;
* watches from a resourceVersion (kopf lists, then watches from the list's
  version), missing no write made meanwhile;
* ``labelSelector`` on lists (equality and existence terms);
* a Secret's ``stringData`` stored base64-encoded in ``data``, as the API
  server stores it;
* server-side apply (``application/apply-patch+yaml``, ``fieldManager``,
  ``force``) and field ownership, in ``metadata.managedFields``: every write
  makes its manager (``fieldManager``, else the User-Agent's product) the
  owner of the fields it changed; an apply makes the manager own exactly the
  fields it sent, removes those it applied last time and not now unless
  another manager owns them too, and answers 409 Conflict when it would
  change a field another manager owns, unless forced (then it takes the
  field over). Simplified: every list is atomic (the API server merges
  associative lists, such as containers, env or ports, item by item by key),
  and an apply with stringData owns the ``data`` keys it becomes. A write
  that changes ``managedFields`` itself sets the owners as it says;
* a short request log: kmock scans every recorded request on each new one,
  which grows quadratic over a module of operator tests (``deletions`` keeps
  the order of deletions, which tests look back at).

Served kinds are kmock's bundled built-ins (a recent K3s) and our three CRDs
from ``k8s/crds``. What stays missing: no garbage collector (owner
references are stored, dependents are not deleted), no admission or schema
validation, no controllers. :func:`run_statefulset_controller` stands in for
the one controller the operator's roller needs.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import copy
import datetime
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import jsonpatch
import kmock
import yaml
from kmock._internal import aiobus, enums, rendering
from kmock._internal.k8s import KubernetesEmulator, KubernetesError

CRD_DIR = Path(__file__).resolve().parent.parent / "k8s" / "crds"
VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
WRITES = {enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE}
KEPT_REQUESTS = 100
APPLY_PATCH = "application/apply-patch+yaml"

FieldPath = tuple[str, ...]
"""A field of an object: its map keys from the root (lists are atomic here)."""
Manager = tuple[str, str, str]
"""(manager, operation Apply or Update, subresource or ""): one managedFields entry."""
SERVER_FIELDS: frozenset[FieldPath] = frozenset(
    {
        ("apiVersion",),
        ("kind",),
        ("metadata", "name"),
        ("metadata", "namespace"),
        ("metadata", "uid"),
        ("metadata", "resourceVersion"),
        ("metadata", "generation"),
        ("metadata", "creationTimestamp"),
        ("metadata", "deletionTimestamp"),
        ("metadata", "managedFields"),
    }
)
"""Fields nobody owns: identity, and what the server itself sets."""


def _plain(value: Any) -> Any:
    """A deep copy with kmock's mapping views turned into plain dicts."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class _RecordingBus(aiobus.Bus[Any]):
    """kmock's event bus for one resource, keeping every event with its version.

    Watches that start from a resourceVersion replay the events after it.
    The history is never trimmed: a test's fake API lives for one module.
    """

    def __init__(self, stamp: Callable[[dict[str, Any]], int]) -> None:
        super().__init__()
        self._stamp_event = stamp
        self.history: list[tuple[int, dict[str, Any]]] = []

    async def put(self, *items: Any) -> None:
        for item in items:
            self.history.append((self._stamp_event(item), item))
        await super().put(*items)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge_patch_between(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A merge-patch turning ``old`` into ``new`` (None removes a key), as kmock applies one."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = _merge_patch_between(before, value)
            if nested:
                patch[key] = nested
        elif value != before or key not in old:
            patch[key] = copy.deepcopy(value)
    return patch


def _merged(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = _merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


_ABSENT = object()


def _leaves(obj: Mapping[str, Any], prefix: FieldPath = ()) -> dict[FieldPath, Any]:
    """Every owned field of ``obj`` with its value: scalars, lists and empty maps."""
    found: dict[FieldPath, Any] = {}
    for key, value in obj.items():
        path = (*prefix, key)
        if path in SERVER_FIELDS:
            continue
        if isinstance(value, Mapping) and value:
            found.update(_leaves(value, path))
        else:
            found[path] = value
    return found


def _overlaps(path: FieldPath, other: FieldPath) -> bool:
    """One field is the other or holds it."""
    shorter = min(len(path), len(other))
    return path[:shorter] == other[:shorter]


def _value_at(obj: Mapping[str, Any], path: FieldPath) -> Any:
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return _ABSENT
        obj = obj[key]
    return obj


def _set_at(obj: dict[str, Any], path: FieldPath, value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(obj.get(key), dict):
            obj[key] = {}
        obj = obj[key]
    obj[path[-1]] = copy.deepcopy(value)


def _remove_at(obj: dict[str, Any], path: FieldPath) -> None:
    """Remove a field, and the maps it leaves empty (as the API server prunes them)."""
    parents = [obj]
    for key in path[:-1]:
        child = parents[-1].get(key)
        if not isinstance(child, dict):
            return
        parents.append(child)
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if parents[depth]:
            break
        parents[depth - 1].pop(path[depth - 1])


def _fields_v1(paths: set[FieldPath]) -> dict[str, Any]:
    """The managedFields ``fieldsV1`` tree of a set of fields (``f:`` keys)."""
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def _paths_of(tree: Mapping[str, Any], prefix: FieldPath = ()) -> set[FieldPath]:
    """The fields a ``fieldsV1`` tree names (the inverse of :func:`_fields_v1`)."""
    found: set[FieldPath] = set()
    for key, below in tree.items():
        if key.startswith("f:"):
            path = (*prefix, key[2:])
            found |= _paths_of(below, path) if below else {path}
    return found


def _owners_of(entries: list[Mapping[str, Any]]) -> dict[Manager, set[FieldPath]]:
    return {
        (e["manager"], e["operation"], e.get("subresource", "")): _paths_of(e.get("fieldsV1") or {})
        for e in entries
    }


def _header(request: rendering.Request, name: str) -> str:
    wanted = name.lower()
    return next((v for k, v in request.headers.items() if k.lower() == wanted), "")


def _encode_string_data(resource: kmock.resource, body: dict[str, Any]) -> dict[str, Any]:
    """Move a Secret's stringData into data (base64); in a merge-patch body or a new object."""
    if resource != kmock.resource("v1/secrets") or not body.get("stringData"):
        return body
    plain = body.pop("stringData")
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in plain.items()}
    body["data"] = {**(body.get("data") or {}), **encoded}
    return body


def _selected(labels: Mapping[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@attrs.define(kw_only=True)
class FakeKubeApi(KubernetesEmulator):
    """kmock's emulator with the shim above; serves built-ins and the Shoal CRDs."""

    deletions: list[tuple[str, str | None, str | None]] = attrs.field(factory=list, init=False)
    """(plural, namespace, name) of every object deleted, in order."""
    _owners: dict[tuple[kmock.resource, str | None, str], dict[Manager, set[FieldPath]]] = (
        attrs.field(factory=dict, init=False)
    )
    """Who owns which fields of each object (rendered into its metadata.managedFields)."""
    _version: int = attrs.field(default=0, init=False)
    _write_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = collections.defaultdict(lambda: _RecordingBus(self._stamp))
        self.resources.load_bundled()
        for path in sorted(CRD_DIR.glob("*.shoal.dev.yaml")):
            crd = yaml.safe_load(path.read_text())
            names = crd["spec"]["names"]
            for version in crd["spec"]["versions"]:
                key = f"{crd['spec']['group']}/{version['name']}/{names['plural']}"
                self.resources[key] = kmock.ResourceInfo(
                    kind=names["kind"],
                    singular=names["singular"],
                    namespaced=crd["spec"]["scope"] == "Namespaced",
                    verbs=VERBS,
                    shortnames=set(names.get("shortNames", [])),
                    categories=set(names.get("categories", [])),
                    subresources=set(version.get("subresources", {})),
                )

    def _has_status(self, resource: kmock.resource) -> bool:
        return resource in self.resources and "status" in self.resources[resource].subresources

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _stamp(self, event: dict[str, Any]) -> int:
        """The event's place in the resource's history; a deletion gets a version of its own."""
        if event.get("type") == "DELETED":
            event["object"] = _plain(event["object"])
            event["object"].setdefault("metadata", {})["resourceVersion"] = self._next_version()
        return int(event["object"].get("metadata", {}).get("resourceVersion") or 0)

    async def _handle(self, request: rendering.Request) -> Any:
        # kmock matches a request to its reactions by scanning every request
        # served so far; a module of operator tests makes thousands, so only
        # the latest are kept (``deletions`` keeps what tests look back at).
        del self._requests[:-KEPT_REQUESTS]
        if request.resource is None or request.action not in WRITES:
            return await super()._handle(request)
        # One write at a time, so the version and generation computed here are
        # those of the object kmock then changes.
        async with self._write_lock:
            try:
                data = await self._shim_write(request)
            except KubernetesError as exc:
                return await self._render_error(exc)
            # kmock finds its reactions by the request's identity, so the body is
            # replaced in place rather than in a copy of the (frozen) request.
            object.__setattr__(request, "data", data)
            return await super()._handle(request)

    def _current(self, request: rendering.Request) -> dict[str, Any] | None:
        assert request.resource is not None and request.name is not None
        return self._lookup(request.resource, request.namespace, request.name)

    def _lookup(
        self, resource: kmock.resource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        # kmock's ObjectsArray finds keys by scanning them all; its dict is keyed
        # by parsed resources, so look there (tests hold hundreds of objects).
        found = self.objects._objects.get((resource, namespace, name))
        return None if found is None or found.deleted else _plain(found.raw)

    async def _shim_write(self, request: rendering.Request) -> Any:
        """The body kmock should apply for this write (the shim's fields added)."""
        assert request.resource is not None
        has_status = self._has_status(request.resource)
        if request.action == enums.action.CREATE:
            data = _encode_string_data(request.resource, copy.deepcopy(request.data or {}))
            return self._created(request, data, (self._manager(request), "Update", ""))

        current = self._current(request)
        if request.action == enums.action.UPDATE and _header(request, "Content-Type").startswith(
            APPLY_PATCH
        ):
            applied = self._applied(request, current)
            if current is None:
                # An apply creates what does not exist yet.
                object.__setattr__(request, "action", enums.action.CREATE)
                manager = (request.params["fieldManager"], "Apply", "")
                return self._created(request, applied, manager)
            patch = self._apply_patch(request, current, applied)
        elif current is None:
            return request.data  # kmock answers 404
        elif request.action == enums.action.DELETE:
            self.deletions.append((str(request.resource.plural), request.namespace, request.name))
            meta = current.get("metadata", {})
            if meta.get("finalizers") and not meta.get("deletionTimestamp"):
                # kmock would mark it without a new resourceVersion; mark it here instead.
                key = (request.resource, request.namespace, request.name)
                stamp = {"deletionTimestamp": _now(), "resourceVersion": self._next_version()}
                self.objects[key].patch({"metadata": stamp})
                await self._buses[request.resource].put(
                    {"type": "MODIFIED", "object": self.objects[key].raw}
                )
            return request.data
        elif isinstance(request.data, list):  # JSON-patch
            try:
                wanted = jsonpatch.apply_patch(current, request.data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise KubernetesError(422, "Invalid", str(exc)) from exc
            patch = _merge_patch_between(current, wanted)
        else:
            patch = _encode_string_data(request.resource, copy.deepcopy(request.data or {}))
        if has_status and request.subresource == "status":
            patch = {k: v for k, v in patch.items() if k == "status"}
        elif has_status:
            patch.pop("status", None)
        patch.setdefault("metadata", {})
        explicit = patch["metadata"].pop("managedFields", None)
        for field in ("uid", "creationTimestamp", "generation", "resourceVersion"):
            patch["metadata"].pop(field, None)
        after = _merged(current, patch)
        key = (request.resource, request.namespace, request.name or "")
        if explicit is not None:
            # As the API server: managedFields a request changes are taken as they are.
            self._owners[key] = _owners_of(explicit)
        elif not _header(request, "Content-Type").startswith(APPLY_PATCH):
            updater = (self._manager(request), "Update", request.subresource or "")
            self._took_by_update(key, updater, current, after)
        generation = current["metadata"].get("generation", 1)
        spec_before = {k: v for k, v in current.items() if k not in ("metadata", "status")}
        spec_after = {k: v for k, v in after.items() if k not in ("metadata", "status")}
        if spec_before != spec_after:
            generation += 1
        patch["metadata"].update(
            generation=generation,
            resourceVersion=self._next_version(),
            managedFields=self._managed_fields(key),
        )
        return patch

    def _created(
        self, request: rendering.Request, data: dict[str, Any], manager: Manager
    ) -> dict[str, Any]:
        """A new object's body: the server's metadata, its creator owning every field."""
        assert request.resource is not None
        metadata = data.setdefault("metadata", {})
        namespace = request.namespace or metadata.get("namespace")
        key = (request.resource, namespace, metadata.get("name") or "")
        if self._lookup(*key) is not None:
            return data  # kmock answers 409, and the owners stay
        metadata.update(
            uid=str(uuid.uuid4()),
            creationTimestamp=_now(),
            generation=1,
            resourceVersion=self._next_version(),
        )
        if request.namespace:
            metadata["namespace"] = request.namespace
        if self._has_status(request.resource):
            data.pop("status", None)
        self._owners[key] = {manager: set(_leaves(data))}
        metadata["managedFields"] = self._managed_fields(key)
        return data

    @staticmethod
    def _manager(request: rendering.Request) -> str:
        """The manager of a write that is not an apply: as the API server names it."""
        agent = _header(request, "User-Agent").split("/", 1)[0]
        return request.params.get("fieldManager") or agent or "unknown"

    def _applied(self, request: rendering.Request, current: Mapping[str, Any] | None) -> Any:
        """An apply's configuration, checked, without what an apply cannot set."""
        assert request.resource is not None
        if not request.params.get("fieldManager"):
            raise KubernetesError(
                422, "Invalid", "fieldManager: Required value: is required for apply patch"
            )
        config = request.data if request.data is not None else yaml.safe_load(request.body)
        if not isinstance(config, Mapping) or not isinstance(config.get("metadata"), Mapping):
            raise KubernetesError(400, "BadRequest", "an apply patch must be an object")
        if config["metadata"].get("name") != request.name:
            raise KubernetesError(400, "BadRequest", "the name in the body differs from the URL")
        config = _encode_string_data(request.resource, copy.deepcopy(dict(config)))
        if self._has_status(request.resource) and request.subresource != "status":
            config.pop("status", None)
        return config

    def _apply_patch(
        self, request: rendering.Request, current: dict[str, Any], config: dict[str, Any]
    ) -> dict[str, Any]:
        """The merge-patch that makes an apply's changes; the owners updated."""
        assert request.resource is not None and request.name is not None
        key = (request.resource, request.namespace, request.name)
        owners = self._owners.setdefault(key, {})
        me: Manager = (request.params["fieldManager"], "Apply", request.subresource or "")
        applied = _leaves(config)
        conflicts = [
            (other, owned, path)
            for path, value in applied.items()
            if value != _value_at(current, path)
            for other, paths in owners.items()
            if other != me
            for owned in paths
            if _overlaps(owned, path)
        ]
        if conflicts and request.params.get("force") != "true":
            version = f"{request.resource.group}/{request.resource.version}".lstrip("/")
            causes = [
                {
                    "reason": "FieldManagerConflict",
                    "message": f'conflict with "{other[0]}" using {version}',
                    "field": "." + ".".join(path),
                }
                for other, _, path in conflicts
            ]
            listed = "; ".join(f"{c['message']}: {c['field']}" for c in causes)
            raise KubernetesError(
                409,
                "Conflict",
                f"Apply failed with {len(causes)} conflict(s): {listed}",
                details={"causes": causes},
            )
        for other, owned, _ in conflicts:  # forced: the fields change hands
            owners[other].discard(owned)
        after = copy.deepcopy(current)
        shared = [path for other, paths in owners.items() if other != me for path in paths]
        for path in owners.get(me, set()) - applied.keys():
            if not any(_overlaps(path, kept) for kept in shared):
                _remove_at(after, path)
        for path, value in applied.items():
            _set_at(after, path, value)
        owners[me] = set(applied)
        return _merge_patch_between(current, after)

    def _took_by_update(
        self,
        key: tuple[kmock.resource, str | None, str],
        updater: Manager,
        before: Mapping[str, Any],
        after: Mapping[str, Any],
    ) -> None:
        """An update owns the fields it changed; whoever owned them before does not."""
        old, new = _leaves(before), _leaves(after)
        changed = {path for path, value in new.items() if old.get(path, _ABSENT) != value}
        touched = changed | (old.keys() - new.keys())
        if not touched:
            return
        owners = self._owners.setdefault(key, {})
        for paths in owners.values():
            paths -= {owned for owned in paths if any(_overlaps(owned, p) for p in touched)}
        owners.setdefault(updater, set()).update(changed)

    def _managed_fields(self, key: tuple[kmock.resource, str | None, str]) -> list[dict[str, Any]]:
        resource = key[0]
        version = f"{resource.group}/{resource.version}".lstrip("/")
        return [
            {
                "manager": manager,
                "operation": operation,
                "apiVersion": version,
                "fieldsType": "FieldsV1",
                "fieldsV1": _fields_v1(paths),
                **({"subresource": subresource} if subresource else {}),
            }
            for (manager, operation, subresource), paths in sorted(
                self._owners.get(key, {}).items()
            )
            if paths
        ]

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        # As the API server: a watch from resourceVersion N streams what changed
        # after N (kopf lists, then watches from the list's version); without one
        # it starts with the current objects. kmock would replay the objects and
        # subscribe afterwards, losing writes made meanwhile (kopf writes its
        # finalizer right after listing, exactly then).
        yield b""
        assert request.resource is not None
        bus = self._buses[request.resource]
        assert isinstance(bus, _RecordingBus)
        since = request.params.get("resourceVersion", "")
        async with self._write_lock:
            mark = await bus.mark()
            if since.isdigit() and int(since) > 0:
                backlog = [event for seq, event in bus.history if seq > int(since)]
            else:
                backlog = [
                    {"type": "ADDED", "object": obj}
                    for obj in self.all_of_resource(request.resource, request.namespace)
                ]
        try:
            for event in backlog:
                if self._watched(request, event):
                    yield event
            async for event in bus.stream(since=mark):
                if self._watched(request, event):
                    yield event
        finally:
            await bus.unmark(mark)

    @staticmethod
    def _watched(request: rendering.Request, event: Mapping[str, Any]) -> bool:
        meta = event.get("object", {}).get("metadata", {})
        return request.namespace in (None, meta.get("namespace")) and request.name in (
            None,
            meta.get("name"),
        )

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        listing: dict[str, Any] = dict(await super()._serve_list(request))  # type: ignore[arg-type]
        listing["metadata"] = {"resourceVersion": str(self._version)}
        selector = request.params.get("labelSelector")
        if selector:
            listing["items"] = [
                item
                for item in listing["items"]
                if _selected(item.get("metadata", {}).get("labels") or {}, selector)
            ]
        return listing

    def stored(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any]:
        """The stored object (for assertions); KeyError when absent or deleted."""
        found = self._lookup(kmock.resource(f"{api_version}/{plural}"), namespace, name)
        if found is None:
            raise KeyError((api_version, plural, namespace, name))
        return found

    def exists(self, api_version: str, plural: str, namespace: str, name: str) -> bool:
        try:
            self.stored(api_version, plural, namespace, name)
        except KeyError:
            return False
        return True

    def all_of(
        self, api_version: str, plural: str, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """Every stored object of a kind (in one namespace, or all when None)."""
        return self.all_of_resource(kmock.resource(f"{api_version}/{plural}"), namespace)

    def all_of_resource(
        self, wanted: kmock.resource, namespace: str | None
    ) -> list[dict[str, Any]]:
        return [
            _plain(obj.raw)
            for (resource, ns, _), obj in list(self.objects.items())
            if resource == wanted and namespace in (None, ns) and not obj.deleted
        ]


@contextlib.asynccontextmanager
async def fake_kube_api() -> AsyncIterator[FakeKubeApi]:
    """A running fake API on a loopback port; ``api.url`` is its base URL."""
    async with FakeKubeApi() as api, kmock.Server(api):
        yield api


POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"


def _pod(sts: Mapping[str, Any], index: int) -> dict[str, Any]:
    meta = sts["metadata"]
    template = sts["spec"]["template"]
    name = f"{meta['name']}-{index}"
    labels = {
        **(template.get("metadata", {}).get("labels") or {}),
        POD_INDEX_LABEL: str(index),
        "statefulset.kubernetes.io/pod-name": name,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": dict(template.get("metadata", {}).get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": copy.deepcopy(template.get("spec") or {}),
    }


async def run_statefulset_controller(api: FakeKubeApi, interval_s: float = 0.1) -> None:
    """Stand-in for kube-controller-manager's StatefulSet controller and the kubelet.

    Keeps pod ``<sts>-<i>`` for each ``i < replicas`` of every StatefulSet,
    made from the StatefulSet's current pod template (labels, annotations,
    spec; plus the ``apps.kubernetes.io/pod-index`` label), so a deleted pod
    comes back from the current template as ``updateStrategy: OnDelete``
    does; deletes pods beyond ``replicas``; marks each pod Ready at once (no
    container runs) and keeps the StatefulSet's status counts. Run it as a
    task and cancel it at the end. It writes through the API, so every change
    has a resourceVersion and a watch event.
    """
    client = api.servers[0].client
    while True:
        # As there is no garbage collector either, a StatefulSet whose owner is
        # gone (a deleted Cluster) is left alone rather than kept running.
        live = {obj["metadata"].get("uid") for obj in api.all_of("shoal.dev/v1alpha1", "clusters")}
        pods: dict[str, list[dict[str, Any]]] = {}
        for pod in api.all_of("v1", "pods"):
            for ref in pod["metadata"].get("ownerReferences") or []:
                pods.setdefault(ref.get("uid"), []).append(pod)
        for sts in api.all_of("apps/v1", "statefulsets"):
            owners = {ref.get("uid") for ref in sts["metadata"].get("ownerReferences") or []}
            if not owners or owners & live:
                await _sync_statefulset(client, sts, pods.get(sts["metadata"]["uid"], []))
        await asyncio.sleep(interval_s)


async def _sync_statefulset(
    client: Any, sts: Mapping[str, Any], pods: list[dict[str, Any]]
) -> None:
    meta = sts["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    replicas = int(sts["spec"].get("replicas", 1))
    base = f"/api/v1/namespaces/{namespace}/pods"
    owned = {pod["metadata"]["name"]: pod for pod in pods}
    ready = 0
    for index in range(replicas):
        pod_name = f"{name}-{index}"
        pod = owned.get(pod_name)
        if pod is None:
            async with client.post(base, json=_pod(sts, index)) as response:
                response.raise_for_status()
            continue
        if pod["metadata"].get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            status = {
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            }
            async with client.patch(
                f"{base}/{pod_name}/status",
                json=status,
                headers={"Content-Type": "application/merge-patch+json"},
            ) as response:
                response.raise_for_status()
        ready += 1
    for pod_name, pod in owned.items():
        index = int(pod["metadata"]["labels"].get(POD_INDEX_LABEL, "-1"))
        if index >= replicas and not pod["metadata"].get("deletionTimestamp"):
            async with client.delete(f"{base}/{pod_name}") as response:
                response.raise_for_status()
    status = sts.get("status") or {}
    wanted = {
        "replicas": replicas,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": meta.get("generation", 1),
    }
    if any(status.get(k) != v for k, v in wanted.items()):
        async with client.patch(
            f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}/status",
            json={"status": wanted},
            headers={"Content-Type": "application/merge-patch+json"},
        ) as response:
            response.raise_for_status()
