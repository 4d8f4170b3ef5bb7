#!/usr/bin/env bash
# Shoal end to end on a real Kubernetes (kind): build the image, install the
# chart, apply k8s/examples, wait for every resource to be Ready, run e2e/.
# Needs Docker (a running daemon), kind, and the repository's .venv
# (`make pytest` or `make helm` fetch helm and kubectl into it). See e2e/README.md.
#
#   e2e/run.sh                  # everything, then delete the kind cluster
#   SHOAL_E2E_KEEP=1 e2e/run.sh # keep the kind cluster to look around or rerun pytest
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
KIND_CLUSTER=${SHOAL_E2E_KIND_CLUSTER:-shoal-e2e}
NAMESPACE=${SHOAL_E2E_NAMESPACE:-shoal-e2e}
IMAGE_REPOSITORY=shoal
IMAGE_TAG=e2e
BIN=$ROOT/.venv/bin

die() { echo "e2e: $*" >&2; exit 1; }

command -v docker >/dev/null || die "needs Docker: docker is not on PATH"
command -v kind >/dev/null || die "needs kind: kind is not on PATH (https://kind.sigs.k8s.io)"
docker info >/dev/null 2>&1 || die "needs Docker: the daemon does not answer (docker info)"
[ -x "$BIN/pytest" ] || make -C "$ROOT" .venv/.installed-test
[ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ] || make -C "$ROOT" helm
export PATH=$BIN:$PATH

if ! kind get clusters | grep -qx "$KIND_CLUSTER"; then
  kind create cluster --name "$KIND_CLUSTER" --wait 180s
fi
if [ "${SHOAL_E2E_KEEP:-0}" != 1 ]; then
  trap 'kind delete cluster --name "$KIND_CLUSTER"' EXIT
fi
export KUBECONFIG=${KUBECONFIG:-$(mktemp)}
kind export kubeconfig --name "$KIND_CLUSTER" --kubeconfig "$KUBECONFIG"

docker build -t "$IMAGE_REPOSITORY:$IMAGE_TAG" "$ROOT"
kind load docker-image "$IMAGE_REPOSITORY:$IMAGE_TAG" --name "$KIND_CLUSTER"

# The operator from the chart with the dev values, running the image just
# built. The dev values' own Cluster is left out: the tests run on the
# examples' Cluster `demo`, whose three brokers let one be deleted under load.
helm upgrade --install shoal "$ROOT/helm/shoal" \
  --namespace shoal-system --create-namespace \
  -f "$ROOT/helm/shoal/values-dev.yaml" \
  --set image.repository="$IMAGE_REPOSITORY" --set image.tag="$IMAGE_TAG" \
  --set cluster.enabled=false \
  --wait --timeout 5m

kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$NAMESPACE" apply -f "$ROOT/k8s/examples/"
# The tests reach the gateway through `kubectl port-forward` on 127.0.0.1,
# so the gateway must advertise that host for its per-broker ports.
kubectl -n "$NAMESPACE" patch cluster demo --type merge \
  -p '{"spec":{"gateway":{"advertiseHost":"127.0.0.1"}}}'

kubectl -n "$NAMESPACE" wait cluster/demo --for=condition=Ready --timeout=10m
kubectl -n "$NAMESPACE" wait tenant/demo topic/events topic/orders \
  --for=condition=Ready --timeout=5m
kubectl -n "$NAMESPACE" get clusters,tenants,topics

SHOAL_E2E_NAMESPACE=$NAMESPACE "$BIN/pytest" -v -rs "$ROOT/e2e" "$@"
