#!/usr/bin/env bash
# Builds the real components the `real` test tier runs (kube-apiserver, etcd, etcdutl, helm and, when the
# machine's is missing or outside kubectl's +-1 minor skew, kubectl; talos-oracle-v1.13 and
# talos-oracle-v1.14, Talos's own configuration code as the renderer's oracle; talos-compat-v1.13 and
# talos-compat-v1.14, Talos's own Go client for the compatibility tier; prometheus and alertmanager for the
# health-gate tests) from Go modules at the versions tools/go.mod, tools/etcdutl/go.mod, tools/helm/go.mod,
# tools/talos-oracle/go{,.v1.14}.mod, tools/talos-compat/go{,.v1.14}.mod, tools/prometheus/go.mod and
# tools/alertmanager/go.mod pin. Nothing
# prebuilt is downloaded: only Go modules through the module proxy. Binaries go to a cache outside the checkout, one directory per hash of the pins,
# so an unchanged pin set is a no-op.
#
#   scripts/tools.sh            build what is missing, print the bin directory last
#   scripts/tools.sh --print-bin  only print the bin directory (nothing built)
#
# Environment: ICHORD_TOOLS_DIR (cache root, default ~/.cache/ichord/tools), ICHORD_TOOLS_JOBS
# (parallel compiles, default 2: the builds are memory- and CPU-heavy).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/tools
jobs=${ICHORD_TOOLS_JOBS:-2}
flags=(-trimpath)  # what shapes the binaries (hashed below); -p only paces the build

die() { echo "tools.sh: $*" >&2; exit 1; }

command -v go >/dev/null || die "go is not installed: the real tier needs go >= 1.26 to build its tools"
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"

pinned() { sed -n "s|^[[:space:]]*\(require \)\{0,1\}$1 \(v[^ ]*\).*|\2|p" "$2" | head -1; }
kube_version=$(pinned k8s.io/kubernetes "$tools/go.mod")
kube_minor=$(echo "$kube_version" | cut -d. -f2)
helm_version=$(pinned helm.sh/helm/v3 "$tools/helm/go.mod")
[[ -n $kube_version && -n $helm_version ]] || die "cannot read the pinned versions from tools/go.mod, tools/helm/go.mod"
# Release builds stamp their version at link time (upstream's hack/lib/version.sh, helm's Makefile);
# without it the binaries report v0.0.0 and version checks (helm's kubeVersion, skew) go wrong.
kube_x=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_x+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
    kube_x+=" -X $pkg.gitTreeState=clean"
done
helm_x="-X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
# helm's Makefile: the Kubernetes version `helm template`/`helm lint` assume is its client-go's (v0.X -> 1.X).
helm_kube_minor=$(cd "$tools/helm" && go list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    helm_x+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$helm_kube_minor"
done

# The v1.14 oracle: the same sources with v1.14's module file; cni_v1_*.go hold the one generator API
# that differs between the two machinery versions.
oracle_v1_14=(-modfile=go.v1.14.mod -tags=talos_v1_14)

# Each binary is cached by its own inputs (its module files and sums, its sources, the flags that
# shape it and the Go toolchain) in store/, so adding or changing one tool rebuilds only that tool.
# The bin directory is named by the hash of every tool's key, so a test run never mixes pin sets.
toolchain=$(go env GOVERSION GOOS GOARCH)
key() {  # key FILE... -- WORD...: the cache key of one binary's inputs
    local files=() words=()
    while (( $# )) && [[ $1 != -- ]]; do files+=("$1"); shift; done
    (( $# )) && shift
    words=("$@")
    { cat "${files[@]}"; echo "${flags[*]} ${words[*]}"; echo "$toolchain"; } | sha256sum | cut -c1-16
}
kube_key=$(key "$tools/go.mod" "$tools/go.sum" -- "$kube_x")
etcd_key=$(key "$tools/go.mod" "$tools/go.sum" "$tools/etcd/main.go" --)
etcdutl_key=$(key "$tools/etcdutl/go.mod" "$tools/etcdutl/go.sum" --)
helm_key=$(key "$tools/helm/go.mod" "$tools/helm/go.sum" -- "$helm_x")
oracle_v1_13_key=$(key "$tools"/talos-oracle/go.{mod,sum} "$tools"/talos-oracle/*.{go,s} --)
oracle_v1_14_key=$(key "$tools"/talos-oracle/go.v1.14.{mod,sum} "$tools"/talos-oracle/*.{go,s} -- "${oracle_v1_14[*]}")
# talos-compat: Talos's own Go client (tools/talos-compat) for the compatibility tier, pinned like the oracle.
compat_v1_14=(-modfile=go.v1.14.mod -tags=talos_v1_14)
compat_v1_13_key=$(key "$tools"/talos-compat/go.{mod,sum} "$tools"/talos-compat/*.go --)
compat_v1_14_key=$(key "$tools"/talos-compat/go.v1.14.{mod,sum} "$tools"/talos-compat/*.go -- "${compat_v1_14[*]}")
keys="kube-apiserver=$kube_key kubectl=$kube_key etcd=$etcd_key etcdutl=$etcdutl_key helm=$helm_key"
keys+=" talos-oracle-v1.13=$oracle_v1_13_key talos-oracle-v1.14=$oracle_v1_14_key"
keys+=" talos-compat-v1.13=$compat_v1_13_key talos-compat-v1.14=$compat_v1_14_key"
# promrules: Prometheus's own rule-file checks (tools/promrules) for the chart's PrometheusRule.
promrules_key=$(key "$tools"/promrules/go.{mod,sum} "$tools"/promrules/*.go --)
keys+=" promrules=$promrules_key"
# prometheus and alertmanager: the real servers the health-gate tests query (tests/real/test_health_gates_real.py).
# Prometheus without its cloud service discovery (-tags remove_all_sd: the tests scrape static targets).
prometheus_tags=(-tags=remove_all_sd)
prometheus_key=$(key "$tools"/prometheus/go.{mod,sum} -- "${prometheus_tags[*]}")
alertmanager_key=$(key "$tools"/alertmanager/go.{mod,sum} "$tools"/alertmanager/ui_web.go.overlay --)
keys+=" prometheus=$prometheus_key alertmanager=$alertmanager_key"
cache=${ICHORD_TOOLS_DIR:-$HOME/.cache/ichord/tools}
pins=$(echo "$keys" | sha256sum | cut -c1-16)
bin=$cache/$pins/bin
store=$cache/store

if [[ ${1:-} == --print-bin ]]; then
    echo "$bin"
    exit 0
fi

# kubectl is supported within one minor of the API server; the machine's is used when it is.
machine_kubectl_ok() {
    command -v kubectl >/dev/null || return 1
    local minor
    minor=$(kubectl version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -1)
    [[ -n $minor ]] && (( minor >= kube_minor - 1 && minor <= kube_minor + 1 ))
}

mkdir -p "$bin"
exec 9>"$cache/.lock"
flock 9 2>/dev/null || true  # one build per pin set at a time; flock is optional

build() {  # build NAME KEY MODULE_DIR PACKAGE [-X ...] [go build flags...]
    local name=$1 k=$2 dir=$3 pkg=$4 xflags=${5:-} start
    local extra=("${@:6}")
    local stored=$store/$name-$k
    if [[ ! -x $stored && -x $bin/$name && ! -L $bin/$name ]]; then
        mkdir -p "$store" && mv "$bin/$name" "$stored"  # built by an earlier layout of this same pin set
    fi
    if [[ -x $stored ]]; then
        ln -sfn "$stored" "$bin/$name"
        echo "$name: cached"
        return
    fi
    echo "$name: building $pkg (go $(go env GOVERSION | sed 's/^go//'), -p $jobs ${flags[*]} ${extra[*]} -ldflags=-s -w)"
    start=$SECONDS
    mkdir -p "$store"
    (cd "$dir" && go build -p "$jobs" "${flags[@]}" "${extra[@]}" "-ldflags=-s -w$xflags" -o "$stored.partial" "$pkg") || return
    mv "$stored.partial" "$stored" && ln -sfn "$stored" "$bin/$name" || return
    echo "$name: built in $((SECONDS - start)) s"
}

total=$SECONDS
build kube-apiserver "$kube_key" "$tools" k8s.io/kubernetes/cmd/kube-apiserver "$kube_x"
build etcd "$etcd_key" "$tools" ichord.local/tools/etcd
build etcdutl "$etcdutl_key" "$tools/etcdutl" go.etcd.io/etcd/etcdutl/v3
build helm "$helm_key" "$tools/helm" helm.sh/helm/v3/cmd/helm " $helm_x"
if [[ ! -x $bin/kubectl ]] && machine_kubectl_ok; then
    echo "kubectl: the machine's ($(command -v kubectl)) is within one minor of $kube_version"
else
    build kubectl "$kube_key" "$tools" k8s.io/kubernetes/cmd/kubectl "$kube_x"
fi
build promrules "$promrules_key" "$tools/promrules" ichord.local/tools/promrules \
    || echo "promrules: failed to build; the chart's rule-file check skips" >&2
build prometheus "$prometheus_key" "$tools/prometheus" github.com/prometheus/prometheus/cmd/prometheus "" \
    "${prometheus_tags[@]}" || echo "prometheus: failed to build; the real tier's health-gate tests skip" >&2
# Alertmanager's ui package embeds ui/app/dist, which its module does not ship (upstream's release builds it with
# npm), so it cannot compile from the module proxy as published (go mod vendor refuses it too). The build copies
# the pinned alertmanager module (from the module cache) into a work directory beside the store, swaps in a
# ui/web.go that serves no UI (tools/alertmanager/ui_web.go.overlay) and replaces the module by that copy; every
# other module is the pinned one and the API the tests use (/api/v2) is untouched.
alertmanager_src() {  # the work directory, made once per key
    local work=$store/alertmanager-src-$alertmanager_key version
    version=$(pinned github.com/prometheus/alertmanager "$tools/alertmanager/go.mod")
    rm -rf "$work" && mkdir -p "$work" && cp "$tools"/alertmanager/go.{mod,sum} "$work"/ || return
    (cd "$work" && go mod download github.com/prometheus/alertmanager) || return
    cp -r "$(go env GOMODCACHE)/github.com/prometheus/alertmanager@$version" "$work/alertmanager" \
        && chmod -R u+w "$work/alertmanager" \
        && cp "$tools/alertmanager/ui_web.go.overlay" "$work/alertmanager/ui/web.go" \
        && (cd "$work" && go mod edit -replace github.com/prometheus/alertmanager=./alertmanager) || return
    echo "$work"
}
if [[ -x $store/alertmanager-$alertmanager_key ]]; then
    build alertmanager "$alertmanager_key" "$tools/alertmanager" unused
elif alertmanager_work=$(alertmanager_src); then
    build alertmanager "$alertmanager_key" "$alertmanager_work" github.com/prometheus/alertmanager/cmd/alertmanager \
        && rm -rf "$alertmanager_work"
else
    false
fi || echo "alertmanager: failed to build; the real tier's Alertmanager gate test skips" >&2
# Last: a failure here leaves the API server tier's binaries built (only that oracle's tests skip).
oracle_failed=()
build talos-oracle-v1.13 "$oracle_v1_13_key" "$tools/talos-oracle" ichord.local/tools/talos-oracle || oracle_failed+=(talos-oracle-v1.13)
build talos-oracle-v1.14 "$oracle_v1_14_key" "$tools/talos-oracle" ichord.local/tools/talos-oracle "" "${oracle_v1_14[@]}" \
    || oracle_failed+=(talos-oracle-v1.14)
build talos-compat-v1.13 "$compat_v1_13_key" "$tools/talos-compat" ichord.local/tools/talos-compat || oracle_failed+=(talos-compat-v1.13)
build talos-compat-v1.14 "$compat_v1_14_key" "$tools/talos-compat" ichord.local/tools/talos-compat "" "${compat_v1_14[@]}" \
    || oracle_failed+=(talos-compat-v1.14)
(( ${#oracle_failed[@]} == 0 )) || die "${oracle_failed[*]} failed to build (the other binaries are built, in $bin)"
echo "tools ready in $((SECONDS - total)) s"
echo "$bin"
