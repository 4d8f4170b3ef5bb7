"""The operator as the chart runs it, against the test control plane (control_plane.py).

* :class:`OperatorIdentity`: the chart's own ServiceAccount, ClusterRole and
  binding (``helm template`` of ``rbac.yaml``, and the brokers' node-reader
  ClusterRole the operator binds brokers to), and a kubeconfig holding a token
  for that ServiceAccount from the TokenRequest API. The operator runs with
  that identity, never as the admin, so whatever the chart's RBAC does not
  grant fails as it would in a real cluster; and what it grants is compared
  with what the API server's audit log says the operator used (rbac_audit.py).
* :class:`OperatorProcess`: ``shoal operator`` as a child process (the
  chart's container runs ``shoal operator --liveness-port 8081 ...``), with
  that kubeconfig, an endpoints file (``SHOAL_OPERATOR_ENDPOINTS_FILE``)
  pointing every Cluster at real Shoal brokers on loopback (KWOK's pods run
  nothing), and short timer intervals (``SHOAL_OPERATOR_*_S``).
* :class:`VolumeProvisioner`: a stand-in for a storage provisioner. The
  StatefulSets' claims would stay Pending, and their pods unscheduled, with no
  PersistentVolume to bind; it gives each new claim a PersistentVolume bound
  to it in advance (``claimRef``), which the controller manager's volume
  binder then binds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import httpx2
import yaml
from control_plane import ROOT, ControlPlane
from harness import free_port, wait_until
from helm_cli import Helm
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import (
    HostPathVolumeSource,
    ObjectReference,
    PersistentVolumeSpec,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim
from rbac_audit import Roles, bound_roles, service_account_user

CHART = ROOT / "helm" / "shoal"
SHOAL = ROOT / ".venv" / "bin" / "shoal"
RELEASE = "optest"
PEERING_LIFETIME_S = 10
"""How long a killed replica's record holds the others back (kopf's default is 60 s)."""
OPERATOR_ACCOUNT = f"{RELEASE}-shoal-operator"
INTERVALS = {
    # Seconds, not the minutes production uses: the tests wait for these.
    "SHOAL_OPERATOR_CLUSTER_STATUS_S": "2",
    "SHOAL_OPERATOR_RETRY_S": "2",
    "SHOAL_OPERATOR_ROLL_POLL_S": "0.5",
    "SHOAL_OPERATOR_POD_POLL_S": "0.5",
    "SHOAL_OPERATOR_ROLL_SAFE_TIMEOUT_S": "30",
    "SHOAL_OPERATOR_ROLL_REJOIN_TIMEOUT_S": "30",
    "SHOAL_OPERATOR_POD_READY_TIMEOUT_S": "60",
}


PEERING = OPERATOR_ACCOUNT
"""The chart's ClusterKopfPeering (``operator.replicas`` above one): named after its operator."""


class OperatorIdentity:
    """The chart's operator ServiceAccount and RBAC in ``namespace``, and a token kubeconfig."""

    def __init__(self, kube: ControlPlane, helm: Helm, namespace: str, directory: Path) -> None:
        self.kube = kube
        self.namespace = namespace
        rendered = helm(
            "template", RELEASE, str(CHART), "-n", namespace,
            "--show-only", "templates/rbac.yaml",
            "--show-only", "templates/broker-node-reader.yaml",
            "--show-only", "templates/operator-peering.yaml",
            # Replicas in kopf's peering: the peering object and its grants.
            "--set", "operator.replicas=2",
        ).stdout  # fmt: skip
        self.chart = [doc for doc in yaml.safe_load_all(rendered) if doc]
        """The chart's objects, as rendered: what its RBAC grants the operator."""
        self.objects = list(self.chart)
        kube.kubectl("create", "namespace", namespace)
        kube.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"kind": "List", "apiVersion": "v1", "items": self.objects}),
        )
        token = kube.kubectl(
            "create", "token", OPERATOR_ACCOUNT, "-n", namespace, "--duration=2h"
        ).stdout.strip()
        admin = yaml.safe_load(kube.kubeconfig.read_text())
        cluster = admin["clusters"][0]["cluster"]
        self.kubeconfig = directory / "operator.kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "shoal-test", "cluster": cluster}],
                    "users": [{"name": OPERATOR_ACCOUNT, "user": {"token": token}}],
                    "contexts": [
                        {
                            "name": "operator",
                            "context": {
                                "cluster": "shoal-test",
                                "user": OPERATOR_ACCOUNT,
                                "namespace": namespace,
                            },
                        }
                    ],
                    "current-context": "operator",
                }
            )
        )
        self.kubeconfig.chmod(0o600)

    @property
    def user(self) -> str:
        """The user the API server sees: the name its audit events carry."""
        return service_account_user(self.namespace, OPERATOR_ACCOUNT)

    def chart_roles(self) -> Roles:
        """The rules the chart binds to the operator's ServiceAccount (its
        peering's included; not the brokers' node reader)."""
        return bound_roles(self.chart, self.namespace, OPERATOR_ACCOUNT)

    def remove(self) -> None:
        for obj in self.objects:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"):
                self.kube.kubectl(
                    "delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false",
                    check=False,
                )  # fmt: skip
        self.kube.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)


class OperatorProcess:
    """``shoal operator`` watching every namespace, as the chart's Deployment runs it,
    as one replica of the peering :data:`PEERING` with priority ``priority``."""

    def __init__(
        self,
        identity: OperatorIdentity,
        endpoints_file: Path,
        log_path: Path,
        name: str,
        priority: int,
    ) -> None:
        self.name = name
        self.priority = priority
        self.log_path = log_path
        self.liveness_port = free_port()
        self.argv = [
            str(SHOAL), "operator",
            "--liveness-port", str(self.liveness_port),
            "--metrics-listen", f"127.0.0.1:{free_port()}",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        self.env = {
            **env,
            **INTERVALS,
            "KUBECONFIG": str(identity.kubeconfig),
            "SHOAL_OPERATOR_ENDPOINTS_FILE": str(endpoints_file),
            "SHOAL_OPERATOR_IMAGE": "registry.invalid/shoal:test",
            "SHOAL_LOG_LEVEL": "INFO",
            # One of several replicas, as a chart with replicas > 1 would run it.
            "SHOAL_OPERATOR_PEERING": PEERING,
            "SHOAL_OPERATOR_PEERING_PRIORITY": str(priority),
            "SHOAL_OPERATOR_PEERING_LIFETIME_S": str(PEERING_LIFETIME_S),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                cwd=self.log_path.parent,
            )
        wait_until(self.live, 60, f"operator {self.name}'s liveness endpoint", interval=0.3)
        return self

    def live(self) -> bool:
        """kopf's liveness endpoint answers (its event loop runs)."""
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(f"operator {self.name} exited:\n{self.log_tail()}")
        try:
            url = f"http://127.0.0.1:{self.liveness_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, chars: int = 6000) -> str:
        """The end of the log without the HTTP client's line per request."""
        lines = [line for line in self.log().splitlines() if "logger=httpx2 " not in line]
        return "\n".join(lines)[-chars:]

    def kill(self) -> None:
        """SIGKILL: a crashed pod, no cleanup of any kind."""
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if not self.running:
            return
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()


class VolumeProvisioner:
    """Gives every new PersistentVolumeClaim a PersistentVolume bound to it in advance.

    A thread watches claims (as the admin) and creates, for each without a
    volume, a hostPath PersistentVolume of the claimed size with ``claimRef``
    naming the claim; the volume binder of the controller manager does the
    binding, as it does for a provisioner's volumes. Nothing is written to
    the host path: KWOK's pods start no container.
    """

    def __init__(self, kube: ControlPlane) -> None:
        self.client = Client(KubeConfig.from_file(str(kube.kubeconfig)), field_manager="tests")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="volume-provisioner", daemon=True)
        self.provided: list[str] = []

    def start(self) -> VolumeProvisioner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for _, claim in self.client.watch(PersistentVolumeClaim, namespace="*"):
                    if self._stop.is_set():
                        return
                    self._provide(claim)
            except httpx2.HTTPError:  # the API server restarting: watch again
                time.sleep(0.5)

    def _provide(self, claim: Any) -> None:
        meta, spec = claim.metadata, claim.spec
        if spec.volumeName or meta.deletionTimestamp:
            return
        name = f"pv-{meta.uid}"
        volume = PersistentVolume(
            metadata=ObjectMeta(name=name, labels={"shoal.dev/test-volume": "true"}),
            spec=PersistentVolumeSpec(
                accessModes=spec.accessModes,
                capacity={"storage": spec.resources.requests["storage"]},
                hostPath=HostPathVolumeSource(path=f"/tmp/{name}"),
                claimRef=ObjectReference(
                    namespace=meta.namespace,
                    name=meta.name,
                    uid=meta.uid,
                    kind="PersistentVolumeClaim",
                    apiVersion="v1",
                ),
                storageClassName=spec.storageClassName or "",
                persistentVolumeReclaimPolicy="Retain",
            ),
        )
        try:
            self.client.create(volume)
            self.provided.append(name)
        except ApiError as exc:
            if exc.status.code != 409:
                raise
