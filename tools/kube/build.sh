#!/usr/bin/env bash
# Builds the Kubernetes test control plane of tests/kube from source with the
# Go toolchain alone (no Docker, no release downloads: only the Go module
# proxy), into a cache outside the repository keyed by version, and prints
# that bin/ folder on stdout. A warm cache is reused as it is.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#       from k8s.io/kubernetes, pinned in kubernetes/go.mod (with go.sum);
#   kwok
#       from sigs.k8s.io/kwok, pinned in kwok/go.mod, a module of its own so
#       that its client libraries need not agree with the control plane's.
#
# The versions are written once, in the two go.mod files; this script reads
# them from there. SHOAL_KUBE_CACHE overrides the cache root
# (default ${XDG_CACHE_HOME:-$HOME/.cache}/shoal/kube).
# See docs/kube-test-control-plane.md.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"

required_version() { # module go.mod -> the version go.mod requires
  awk -v m="$1" '$1 == "require" { $1 = ""; $0 = $0 } $1 == m && $2 ~ /^v/ { print $2; exit }' "$2"
}
k8s_version="$(required_version k8s.io/kubernetes "$here/kubernetes/go.mod")"
kwok_version="$(required_version sigs.k8s.io/kwok "$here/kwok/go.mod")"
if [ -z "$k8s_version" ] || [ -z "$kwok_version" ]; then
  echo "build.sh: cannot read the pinned versions from $here/*/go.mod" >&2
  exit 1
fi

cache_root="${SHOAL_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shoal/kube}"
dest="$cache_root/$k8s_version-kwok-$kwok_version"
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)

# .complete is written last, after every binary is in place: a build that
# was interrupted leaves no .complete and is done again.
if [ -f "$dest/.complete" ]; then
  echo "$dest/bin"
  exit 0
fi

command -v go >/dev/null || { echo "build.sh: needs the go command (Go >= 1.26)" >&2; exit 1; }
echo "building Kubernetes $k8s_version and KWOK $kwok_version into $dest (cold: 20 to 35 minutes on 2 cores)" >&2
start=$SECONDS
partial="$dest/bin.partial"
rm -rf "$partial"
mkdir -p "$partial"

# The same version stamps as Kubernetes' own release build
# (hack/lib/version.sh), so that `kubectl version`, Helm's kubeVersion checks
# and the discovery API report the real release rather than v0.0.0-master.
minor="${k8s_version#v*.}"
minor="${minor%%.*}"
stamps=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  stamps+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamps+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# CGO off as upstream builds them: static binaries, no C compiler needed.
# -s -w: no symbol tables or DWARF, which also shortens linking.
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
(
  cd "$here/kubernetes"
  go build -trimpath -ldflags "-s -w$stamps" -o "$partial/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl
)
(
  cd "$here/kwok"
  go build -trimpath -ldflags "-s -w" -o "$partial/" sigs.k8s.io/kwok/cmd/kwok
)
for b in "${binaries[@]}"; do
  [ -x "$partial/$b" ] || { echo "build.sh: $b was not built" >&2; exit 1; }
done

# The kwok binary fakes nothing on its own: what it does to nodes and pods is
# told by Stage objects, which kwokctl normally passes it. These are KWOK's
# own "fast" stages of the same release (nodes Ready at once with a Lease
# heartbeat; pods Running and Ready at once, Succeeded when they are a Job's,
# gone at once when deleted), taken from the module just built.
kwok_dir="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
  pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
  echo "---"
  cat "$kwok_dir/kustomize/stage/$stage.yaml"
done >"$partial/kwok-stages.yaml"
rm -rf "$dest/bin"
mv "$partial" "$dest/bin"
echo "built in $((SECONDS - start)) s" >"$dest/.complete"
echo "built Kubernetes $k8s_version and KWOK $kwok_version in $((SECONDS - start)) s" >&2
echo "$dest/bin"
