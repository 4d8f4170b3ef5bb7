"""Differential test: Apache Kafka and Shoal answer the same client calls the same way.

Every scenario of :mod:`differential_scenarios` (a plain function from an
:class:`Endpoint` to a JSON-able observation) runs against Apache Kafka 4.3.1
(``make kafka`` installs it, on a fresh machine too: this never skips) and
against one Shoal cluster of three brokers and a gateway, through both of
Shoal's doors where the scenario allows:

* ``direct``: the brokers' internal listeners, no SASL, no namespace;
* ``gateway``: a tenant's API key over SASL/PLAIN, names in its namespace.

Both observations go through :func:`differential_scenarios.normalise` and are
compared field by field. ``differential_differences.toml`` is the one list of
expected differences; for each: the scenario, the doors, the path in the
observation, Kafka's and Shoal's values (or "any"), a kind and a reason:

* ``by-design``: Shoal differs on purpose (tenancy, auto-create off, ...);
* ``not-built``: a Kafka feature Shoal does not have yet, with its issue;
* ``bug``: Shoal is wrong. The case is marked ``xfail(strict=True,
  raises=KnownBugError)``: it fails as expected only when every listed
  difference occurs and no unlisted one does. Anything else (a new
  difference, or the bug fixed and its entry still there) fails for real.

A difference not in the file fails the case with a readable diff; a listed
``by-design``/``not-built`` difference that no longer occurs fails it too, so
the list cannot rot. Kafka's observation of each scenario is taken once per
module and cached; Kafka's run and Shoal's run of a case go side by side.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import EtcdServer, GatewayCluster, _teardown, start_gateway_cluster
from differential_scenarios import SCENARIOS, Endpoint, Scenario, normalise
from shoal.benchmarks.apache_kafka import SHORT_RUN_JVM_OPTS, ApacheKafka, default_kafka_home

# A cold `make kafka` downloads about 150 MB from Maven Central.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
DIFFERENCES = Path(__file__).with_name("differential_differences.toml")
KINDS = ("by-design", "not-built", "bug")
MISSING = "<missing>"
"""A path one side's observation has and the other's has not."""
ANY = "any"
NULL = "<null>"
"""TOML has no null: this stands for JSON null (None) in the differences file."""
TENANT = "differential"
# As `shoal dev` and the Kafka launcher: topics need two in-sync replicas for acks=all.
SHOAL_BROKER_ENV = {"SHOAL_TOPIC_DEFAULTS": json.dumps({"min.insync.replicas": "2"})}


# -- the differences file -------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    path: str
    kafka: Any
    shoal: Any

    def __str__(self) -> str:
        return f"  {self.path}:\n      kafka: {_json(self.kafka)}\n      shoal: {_json(self.shoal)}"


@dataclass(frozen=True)
class Expected:
    """One entry of differential_differences.toml."""

    scenarios: tuple[str, ...]
    paths: tuple[str, ...]
    kafka: Any
    shoal: Any
    kind: str
    reason: str
    doors: tuple[str, ...]
    issue: int | None

    def applies(self, scenario: str, door: str) -> bool:
        return scenario in self.scenarios and door in self.doors

    def matches(self, difference: Difference, path: str | None = None) -> bool:
        """Whether this entry explains the difference (through ``path``, else any of its paths)."""
        return (
            any(_path_matches(p, difference.path) for p in ([path] if path else self.paths))
            and _value_matches(self.kafka, difference.kafka)
            and _value_matches(self.shoal, difference.shoal)
        )

    def unseen_paths(self, differences: list[Difference]) -> list[str]:
        return [p for p in self.paths if not any(self.matches(d, p) for d in differences)]

    def __str__(self) -> str:
        issue = f", issue {self.issue}" if self.issue else ""
        return f"[{self.kind}{issue}] {', '.join(self.paths)}: {self.reason}"


def _path_matches(pattern: str, path: str) -> bool:
    """``*`` matches any run of characters; everything else, brackets too, is literal."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, path) is not None


def _value_matches(expected: Any, actual: Any) -> bool:
    if expected == ANY:
        return True
    if expected == NULL:
        return actual is None
    return _json(expected) == _json(actual)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _strings(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def load_differences(path: Path = DIFFERENCES) -> list[Expected]:
    """The entries, each checked: known scenarios and doors, a kind, values, a reason."""
    entries = tomllib.loads(path.read_text()).get("difference", [])
    fields = {"scenario", "path", "kafka", "shoal", "kind", "reason", "doors", "issue"}
    out = []
    for i, raw in enumerate(entries):
        where = f"{path.name} entry {i + 1} ({raw.get('scenario')}: {raw.get('path')})"
        assert not set(raw) - fields, f"{where}: unknown fields {sorted(set(raw) - fields)}"
        assert {"scenario", "path", "kafka", "shoal", "kind"} <= set(raw), f"{where}: incomplete"
        scenarios = _strings(raw["scenario"])
        unknown = [name for name in scenarios if name not in SCENARIOS]
        assert not unknown, f"{where}: no such scenario {unknown}"
        allowed = set.intersection(*(set(SCENARIOS[name].doors) for name in scenarios))
        doors = tuple(raw.get("doors", sorted(allowed)))
        assert doors and set(doors) <= allowed, f"{where}: doors {doors} not in {sorted(allowed)}"
        assert raw["kind"] in KINDS, f"{where}: kind must be one of {KINDS}"
        assert raw.get("reason"), f"{where}: a reason is required"
        if raw["kind"] == "not-built":
            assert "issue" in raw, f"{where}: a not-built difference names its issue (0: none)"
        out.append(
            Expected(
                scenarios=scenarios,
                paths=_strings(raw["path"]),
                kafka=raw["kafka"],
                shoal=raw["shoal"],
                kind=raw["kind"],
                reason=" ".join(raw["reason"].split()),
                doors=doors,
                issue=raw.get("issue"),
            )
        )
    return out


EXPECTED = load_differences()


# -- comparing -------------------------------------------------------------------------------


def compare(kafka: Any, shoal: Any, path: str = "") -> list[Difference]:
    """Every leaf where the two normalised observations differ, by dotted path.

    Dicts are compared key by key (a key only one side has is ``<missing>`` on
    the other), lists of dicts or lists element by element (``path[i]``), and
    anything else as a whole value (type included: 1 is not True).
    """
    if isinstance(kafka, dict) and isinstance(shoal, dict):
        keys = list(kafka) + [k for k in shoal if k not in kafka]
        out: list[Difference] = []
        for key in keys:
            sub = f"{path}.{key}" if path else str(key)
            out += compare(kafka.get(key, MISSING), shoal.get(key, MISSING), sub)
        return out
    if (
        isinstance(kafka, list)
        and isinstance(shoal, list)
        and any(isinstance(v, dict | list) for v in kafka + shoal)
    ):
        out = []
        for i in range(max(len(kafka), len(shoal))):
            left = kafka[i] if i < len(kafka) else MISSING
            right = shoal[i] if i < len(shoal) else MISSING
            out += compare(left, right, f"{path}[{i}]")
        return out
    if _json(kafka) != _json(shoal):
        return [Difference(path or "<root>", kafka, shoal)]
    return []


class KnownBugError(AssertionError):
    """Exactly the differences listed as bugs for this case, and nothing unexplained."""


def judge(name: str, door: str, kafka: Any, shoal: Any) -> None:
    """Fail unless the differences are exactly the listed ones (see the module docstring)."""
    differences = compare(kafka, shoal)
    listed = [e for e in EXPECTED if e.applies(name, door)]
    unexplained = [d for d in differences if not any(e.matches(d) for e in listed)]
    stale = [(e, unseen) for e in listed if (unseen := e.unseen_paths(differences))]
    problems = []
    if unexplained:
        problems.append(
            f"{len(unexplained)} difference(s) not listed in {DIFFERENCES.name} "
            f"(scenario {name!r}, door {door!r}):\n" + "\n".join(map(str, unexplained))
        )
    if stale:
        problems.append(
            f"listed in {DIFFERENCES.name} but not seen (fixed? remove or narrow the entry):\n"
            + "\n".join(f"  {', '.join(unseen)} of {e}" for e, unseen in stale)
        )
    if problems:
        raise AssertionError(f"{SCENARIOS[name].doc}\n\n" + "\n\n".join(problems))
    bugs = [e for e in listed if e.kind == "bug"]
    if bugs:
        raise KnownBugError("known bug(s):\n" + "\n".join(f"  {e}" for e in bugs))


# -- clusters ---------------------------------------------------------------------------------


@dataclass
class Systems:
    kafka: ApacheKafka
    shoal: GatewayCluster
    tenant: Any
    kafka_observations: dict[str, Any]
    lock: threading.Lock

    def endpoint(self, system: str) -> Endpoint:
        if system == "kafka":
            return Endpoint("kafka", {"bootstrap.servers": self.kafka.bootstrap})
        if system == "direct":
            return Endpoint("shoal-direct", {"bootstrap.servers": self.shoal.internal_bootstrap})
        return Endpoint("shoal-gateway", self.tenant.librdkafka())


@pytest.fixture(scope="module")
def systems(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Systems]:
    """Apache Kafka and Shoal (three brokers, a gateway, a tenant), started side by side."""
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=840)
    kafka = ApacheKafka(tmp_path_factory.mktemp("apache-kafka"), home, jvm_opts=SHORT_RUN_JVM_OPTS)
    kafka_error: list[BaseException] = []

    def start_kafka() -> None:
        try:
            kafka.start()
        except BaseException as exc:  # reported below, in the test's thread
            kafka_error.append(exc)

    starter = threading.Thread(target=start_kafka, name="start-apache-kafka")
    starter.start()
    root = tmp_path_factory.mktemp("differential-shoal")
    started = []
    try:
        shoal, started = start_gateway_cluster(etcd, root, brokers=3, broker_env=SHOAL_BROKER_ENV)
        tenant = shoal.tenant(TENANT)
        starter.join()
        if kafka_error:
            raise kafka_error[0]
        yield Systems(kafka, shoal, tenant, {}, threading.Lock())
    finally:
        starter.join()
        kafka.stop()
        failed = any(
            getattr(item, "report_call", None) is not None and item.report_call.failed
            for item in request.session.items
            if item.module is request.module
        )
        if started:
            gateway = shoal.gateway
            if gateway.running:
                gateway.stop()
            if failed:
                print(f"\n----- gateway log ({gateway.log_path}) -----")
                print(gateway.log_tail())
        _teardown(started, failed)
        shutil.rmtree(root, ignore_errors=True)


def observe(scenario: Scenario, env: Endpoint, tolerate: bool) -> Any:
    """The scenario's normalised observation; Shoal's crash is an observation too."""
    try:
        return normalise(scenario.run(env), env)
    except Exception as exc:
        if not tolerate:
            raise
        return {"crashed": f"{type(exc).__name__}: {exc}"}


def kafka_observation(systems: Systems, scenario: Scenario) -> Any:
    with systems.lock:
        cached = systems.kafka_observations.get(scenario.name)
    if cached is None:
        cached = observe(scenario, systems.endpoint("kafka"), tolerate=False)
        with systems.lock:
            systems.kafka_observations[scenario.name] = cached
    return cached


# -- the cases -------------------------------------------------------------------------------


def _cases() -> list[Any]:
    cases = []
    for name, scenario in SCENARIOS.items():
        for door in scenario.doors:
            bugs = [e for e in EXPECTED if e.kind == "bug" and e.applies(name, door)]
            marks = (
                [
                    pytest.mark.xfail(
                        strict=True, raises=KnownBugError, reason="; ".join(e.reason for e in bugs)
                    )
                ]
                if bugs
                else []
            )
            cases.append(pytest.param(name, door, id=f"{name}-{door}", marks=marks))
    return cases


@pytest.mark.parametrize(("name", "door"), _cases())
def test_shoal_answers_as_kafka_does(systems: Systems, name: str, door: str) -> None:
    scenario = SCENARIOS[name]
    with ThreadPoolExecutor(max_workers=2) as pool:
        kafka = pool.submit(kafka_observation, systems, scenario)
        shoal = pool.submit(observe, scenario, systems.endpoint(door), True)
        judge(name, door, kafka.result(), shoal.result())


def test_every_scenario_has_a_door_and_a_doc() -> None:
    assert len(SCENARIOS) >= 40
    for scenario in SCENARIOS.values():
        assert scenario.doors and set(scenario.doors) <= {"direct", "gateway"}, scenario.name
        assert scenario.doc, f"{scenario.name} says what it checks"


def test_the_differences_file_is_the_one_list() -> None:
    """Loading checks each entry; every entry names a scenario, doors, values and a reason."""
    assert load_differences() == EXPECTED
    for entry in EXPECTED:
        assert entry.kind in KINDS
        if entry.kind == "not-built":
            assert entry.issue is not None
