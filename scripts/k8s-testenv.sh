#!/usr/bin/env bash
# A real Kubernetes control plane for the tests, on 127.0.0.1 only: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and Kueue's manager, built once from their Go modules
# at pinned versions (cached under ${IRIS_CACHE_DIR:-$HOME/.cache/iris}/k8s/<versions>/bin),
# plus CoreWeave-shaped Node objects registered through the API. See scripts/k8s-testenv/README.md.
#
#   scripts/k8s-testenv.sh build   build (or find cached) binaries only
#   scripts/k8s-testenv.sh up      build if needed, start everything, print the env line
#   scripts/k8s-testenv.sh env     print `export KUBECONFIG=...` for a running env
#   scripts/k8s-testenv.sh down    stop every process `up` started, remove the run dir
#   scripts/k8s-testenv.sh status  what is running
#
# Environment: IRIS_CACHE_DIR (cache root), IRIS_K8S_RUN_DIR (run dir, default
# ${TMPDIR:-/tmp}/iris-k8s-testenv), IRIS_K8S_NAMESPACE (the Iris namespace, default iris),
# IRIS_K8S_NODES (0 = register no nodes), IRIS_K8S_KUEUE_OBJECTS (0 = no ClusterQueue etc.).
set -euo pipefail

K8S_VERSION=v1.35.4     # k8s.io/kubernetes; its staging modules at v0.35.4 (see kube/go.mod)
ETCD_VERSION=v3.6.16    # go.etcd.io/etcd/server/v3 (see etcd/go.mod)
KUEUE_VERSION=v0.17.0   # sigs.k8s.io/kueue, the newest the Go proxy serves

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$HERE/k8s-testenv
CACHE=${IRIS_CACHE_DIR:-$HOME/.cache/iris}/k8s
KEY=k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kueue-${KUEUE_VERSION}
BIN=$CACHE/$KEY/bin
SHARE=$CACHE/$KEY/share
RUN=${IRIS_K8S_RUN_DIR:-${TMPDIR:-/tmp}/iris-k8s-testenv}
NS=${IRIS_K8S_NAMESPACE:-iris}
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kueue)

log() { printf 'k8s-testenv: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

need_tools() {
  local t
  for t in go openssl curl jq; do
    command -v "$t" >/dev/null || die "$t is required (see scripts/k8s-testenv/README.md)"
  done
}

go_env() {
  export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build GOFLAGS=-mod=mod CGO_ENABLED=0
  export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
}

built() {
  local c
  for c in "${COMPONENTS[@]}"; do [[ -x $BIN/$c ]] || return 1; done
  [[ -d $SHARE/kueue/crd && -f $SHARE/kueue/webhooks.yaml ]]
}

# Builds what is missing, once per version key (a lock keeps concurrent callers to one build).
build() {
  built && return 0
  need_tools
  mkdir -p "$BIN" "$SHARE" "$CACHE/go"
  exec 9>"$CACHE/$KEY.lock"
  flock 9
  if built; then exec 9>&-; return 0; fi
  grep -q "k8s.io/kubernetes $K8S_VERSION" "$SRC/kube/go.mod" || die "kube/go.mod does not pin $K8S_VERSION"
  grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION" "$SRC/etcd/go.mod" || die "etcd/go.mod does not pin $ETCD_VERSION"
  go_env
  local start=$SECONDS c ld
  log "building into $BIN (first run only; nice -n 10)"
  if [[ ! -x $BIN/etcd ]]; then
    (cd "$SRC/etcd" && nice -n 10 go build -trimpath -ldflags='-s -w' -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3)
    mv "$BIN/etcd.tmp" "$BIN/etcd"; log "etcd built ($((SECONDS - start)) s)"
  fi
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ld+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35"
  ld+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ld+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [[ -x $BIN/$c ]] && continue
    (cd "$SRC/kube" && nice -n 10 go build -trimpath -ldflags="$ld" -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c")
    mv "$BIN/$c.tmp" "$BIN/$c"; log "$c built ($((SECONDS - start)) s)"
  done
  if [[ ! -x $BIN/kueue ]]; then
    GOBIN=$BIN nice -n 10 go install -trimpath -ldflags='-s -w' "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
    log "kueue built ($((SECONDS - start)) s)"
  fi
  local dir
  dir=$(cd "$SRC/etcd" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | jq -r .Dir)
  rm -rf "$SHARE/kueue"; mkdir -p "$SHARE/kueue"
  cp -r "$dir/config/components/crd/bases" "$SHARE/kueue/crd"
  cp "$dir/config/components/webhook/manifests.yaml" "$SHARE/kueue/webhooks.yaml"
  chmod -R u+w "$SHARE/kueue"
  log "build done in $((SECONDS - start)) s"
  exec 9>&-
}

# free_port VAR: sets VAR to a loopback port nothing listens on and no other run holds.
# Drawn from 10000..(start of the kernel's ephemeral range): an ephemeral port that is free now
# can be taken by any outgoing connection before our server binds it. Runs started at the same
# time (the tests start several) would otherwise pick the same port before either binds it, and
# the node agents' kubelet port is bound only later, by the test: every run records the ports it
# holds under $PORTS (one file per port, naming the run), choosing under a lock, and `down`
# releases them. A holder whose run dir is gone (a killed run) no longer holds its ports.
PORTS=$CACHE/ports
USED_PORTS=" "
free_port() {
  local -n out=$1
  local p f owner lo=10000 hi=32768
  read -r hi _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  ((hi > lo + 1000)) || hi=32768
  mkdir -p "$PORTS"
  exec 8>"$PORTS.lock"
  flock 8
  for f in "$PORTS"/*; do
    [[ -f $f ]] || continue
    owner=$(cat "$f" 2>/dev/null) || continue
    [[ -d $owner ]] || rm -f "$f"
  done
  while :; do
    p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo)))
    [[ $USED_PORTS == *" $p "* || -e $PORTS/$p ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$RUN" >"$PORTS/$p"
      USED_PORTS+="$p "; out=$p
      exec 8>&-
      return
    fi
  done
}

# release_ports: gives back the ports this run holds.
release_ports() {
  local f
  [[ -d $PORTS ]] || return 0
  for f in "$PORTS"/*; do
    [[ -f $f && $(cat "$f" 2>/dev/null) == "$RUN" ]] && rm -f "$f"
  done
  return 0
}

# start NAME CMD...: runs in its own session, logs to logs/NAME.log, pid in pids/NAME.pid.
start() {
  local name=$1; shift
  setsid "$@" >"$RUN/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/pids/$name.pid"
}

alive() { [[ -f $RUN/pids/$1.pid ]] && kill -0 "$(cat "$RUN/pids/$1.pid")" 2>/dev/null; }

# wait_for NAME SECONDS CMD...: polls CMD until it succeeds; fails early if NAME died.
wait_for() {
  local name=$1 limit=$2 t=0; shift 2
  until "$@" >/dev/null 2>&1; do
    alive "$name" || { tail -n 30 "$RUN/logs/$name.log" >&2; die "$name exited"; }
    ((t++ < limit * 5)) || { tail -n 30 "$RUN/logs/$name.log" >&2; die "$name not ready after ${limit}s"; }
    sleep 0.2
  done
}

kc() { "$BIN/kubectl" --kubeconfig "$RUN/kubeconfig" "$@"; }

certs() {
  local d=$RUN/pki
  mkdir -p "$d"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=iris-test-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    # One serving certificate for 127.0.0.1 (API server and Kueue's webhook server).
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >san.ext
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout serving.key \
      -out serving.csr 2>/dev/null
    openssl x509 -req -in serving.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
      -extfile san.ext -out serving.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    mkdir -p kueue && cp serving.crt kueue/tls.crt && cp serving.key kueue/tls.key
  )
}

kubeconfig() {
  local token=$1 port=$2
  cat >"$RUN/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: iris-test
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $RUN/pki/ca.crt
users:
- name: admin
  user:
    token: $token
contexts:
- name: iris-test
  context: {cluster: iris-test, user: admin, namespace: $NS}
current-context: iris-test
EOF
}

http_kubeconfig() {
  cat >"$RUN/kubeconfig-http" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: iris-test-http
  cluster: {server: "http://127.0.0.1:$1"}
users:
- name: proxy
  user: {}
contexts:
- name: iris-test-http
  context: {cluster: iris-test-http, user: proxy, namespace: $NS}
current-context: iris-test-http
EOF
}

kueue_config() {
  local webhook=$1 health=$2
  cat >"$RUN/kueue.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$health
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: $webhook
  certDir: $RUN/pki/kueue
leaderElection:
  leaderElect: false
# As Kueue's released manifests configure it (the library default is 20 QPS, one worker per
# kind, which admits and ungates a few pods a second).
# IRIS_K8S_KUEUE_QPS, _BURST and _WORKERS override them (benchmarks of Kueue's own ceiling).
controller:
  groupKindConcurrency:
    Pod: ${IRIS_K8S_KUEUE_WORKERS:-5}
    Workload.kueue.x-k8s.io: ${IRIS_K8S_KUEUE_WORKERS:-5}
clientConnection:
  qps: ${IRIS_K8S_KUEUE_QPS:-50}
  burst: ${IRIS_K8S_KUEUE_BURST:-100}
internalCertManagement:
  enable: false
managedJobsNamespaceSelector:
  matchLabels:
    kubernetes.io/metadata.name: $NS
integrations:
  frameworks: ["pod"]
EOF
}

# With internal cert management off, Kueue v0.17 reads a metrics certificate from a fixed
# path, /etc/kueue/metrics/certs, even when metrics serving is off (bindAddress "0"). Put a
# throwaway one there when none is present (the machine's only change outside the run dir).
kueue_metrics_cert() {
  local d=/etc/kueue/metrics/certs
  [[ -f $d/tls.crt && -f $d/tls.key ]] && return 0
  mkdir -p "$d" 2>/dev/null && cp "$RUN/pki/serving.crt" "$d/tls.crt" && cp "$RUN/pki/serving.key" "$d/tls.key" \
    || die "Kueue needs $d/tls.{crt,key} (any certificate; metrics serving is off): create it or run as root"
}

# Kueue's webhook configurations, reduced to what the "pod" integration and Kueue's own
# objects serve, pointed at the local webhook server, and scoped to the Iris namespace.
webhooks() {
  local port=$1 ca
  ca=$(base64 -w0 <"$RUN/pki/ca.crt")
  kc create --dry-run=client -o json -f "$SHARE/kueue/webhooks.yaml" | jq -s --arg url "https://127.0.0.1:$port" \
    --arg ca "$ca" --arg ns "$NS" '
    [.[] | if .kind == "List" then .items[] else . end] | {apiVersion: "v1", kind: "List", items: map(
      .metadata.name = "kueue-" + .metadata.name
      | .webhooks |= map(
          select(any(.rules[]; (.apiGroups | index("kueue.x-k8s.io")) or (.resources | index("pods"))))
          | .clientConfig = {url: ($url + .clientConfig.service.path), caBundle: $ca}
          | if any(.rules[]; .resources | index("pods")) then
              .namespaceSelector = {matchLabels: {"kubernetes.io/metadata.name": $ns}}
            else . end))}' >"$RUN/kueue-webhooks.json"
  kc apply -f "$RUN/kueue-webhooks.json" >/dev/null
}

# Kueue's CRDs; the ones serving two versions (v1beta1, v1beta2 stored) convert through Kueue's
# /convert webhook, as its kustomization patches them in a real install.
crds() {
  local port=$1 ca
  ca=$(base64 -w0 <"$RUN/pki/ca.crt")
  kc create --dry-run=client -o json -f "$SHARE/kueue/crd" | jq -s --arg url "https://127.0.0.1:$port/convert" \
    --arg ca "$ca" '
    [.[] | if .kind == "List" then .items[] else . end] | {apiVersion: "v1", kind: "List", items: (map(
      if (.metadata.name | IN("workloads.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io",
          "localqueues.kueue.x-k8s.io", "cohorts.kueue.x-k8s.io", "multikueueclusters.kueue.x-k8s.io"))
      then .spec.conversion = {strategy: "Webhook", webhook: {conversionReviewVersions: ["v1"],
        clientConfig: {url: $url, caBundle: $ca}}}
      else . end))}' >"$RUN/kueue-crds.json"
  kc apply --server-side -f "$RUN/kueue-crds.json" >/dev/null
  kc wait --for=condition=Established --timeout=60s crd --all >/dev/null
}

up() {
  if [[ -d $RUN/pids ]] && alive kube-apiserver; then
    log "already up in $RUN"; envline; return 0
  fi
  build
  need_tools
  rm -rf "$RUN"; mkdir -p "$RUN/logs" "$RUN/pids" "$RUN/etcd"
  trap up_failed EXIT
  local t0=$SECONDS
  local p_etcd p_peer p_api p_kcm p_sched p_hook p_health p_proxy p_kubelet token
  free_port p_etcd; free_port p_peer; free_port p_api; free_port p_kcm
  free_port p_sched; free_port p_hook; free_port p_health; free_port p_proxy
  # The nodes' kubelet endpoint (every node is 127.0.0.1): the node agent serves container logs
  # there, with the run's serving certificate, and the API server proxies `pods/log` to it.
  free_port p_kubelet
  echo "$p_kubelet" >"$RUN/kubelet-port"
  token=$(openssl rand -hex 16)
  certs
  echo "$token,admin,admin,system:masters" >"$RUN/pki/tokens.csv"
  kubeconfig "$token" "$p_api"

  start etcd "$BIN/etcd" --name=iris-test --data-dir="$RUN/etcd" --unsafe-no-fsync \
    --listen-client-urls="http://127.0.0.1:$p_etcd" --advertise-client-urls="http://127.0.0.1:$p_etcd" \
    --listen-peer-urls="http://127.0.0.1:$p_peer" --initial-advertise-peer-urls="http://127.0.0.1:$p_peer" \
    --initial-cluster="iris-test=http://127.0.0.1:$p_peer" --log-level=warn
  wait_for etcd 30 curl -sf "http://127.0.0.1:$p_etcd/health"

  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$p_etcd" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$p_api" \
    --tls-cert-file="$RUN/pki/serving.crt" --tls-private-key-file="$RUN/pki/serving.key" \
    --client-ca-file="$RUN/pki/ca.crt" --token-auth-file="$RUN/pki/tokens.csv" \
    --authorization-mode=RBAC --allow-privileged=true \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$RUN/pki/sa.pub" --service-account-signing-key-file="$RUN/pki/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 --endpoint-reconciler-type=none \
    --disable-admission-plugins=TaintNodesByCondition --cert-dir="$RUN/apiserver" \
    --kubelet-preferred-address-types=InternalIP --kubelet-certificate-authority="$RUN/pki/ca.crt"
  wait_for kube-apiserver 90 curl -sf --cacert "$RUN/pki/ca.crt" -H "Authorization: Bearer $token" \
    "https://127.0.0.1:$p_api/readyz"

  # Plain HTTP on loopback for clients without a TLS stack (the kube crate as the workspace builds
  # it today has none): `kubectl proxy`, with the admin credentials, in front of the API server.
  start kubectl-proxy "$BIN/kubectl" --kubeconfig "$RUN/kubeconfig" proxy --address=127.0.0.1 \
    --port="$p_proxy" --accept-hosts='^(localhost|127\.0\.0\.1)$'
  http_kubeconfig "$p_proxy"

  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$RUN/kubeconfig" \
    --authentication-kubeconfig="$RUN/kubeconfig" --authorization-kubeconfig="$RUN/kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$p_kcm" --cert-dir="$RUN/kcm" --leader-elect=false \
    --service-account-private-key-file="$RUN/pki/sa.key" --root-ca-file="$RUN/pki/ca.crt" \
    --controllers='*,-node-lifecycle-controller,-node-ipam-controller,-node-route-controller,-service-lb-controller,-cloud-node-lifecycle-controller'
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$RUN/kubeconfig" \
    --authentication-kubeconfig="$RUN/kubeconfig" --authorization-kubeconfig="$RUN/kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$p_sched" --cert-dir="$RUN/scheduler" --leader-elect=false

  kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $NS}
---
apiVersion: v1
kind: Namespace
metadata: {name: kueue-system}
EOF
  crds "$p_hook"

  kueue_config "$p_hook" "$p_health"
  kueue_metrics_cert
  KUBECONFIG=$RUN/kubeconfig start kueue "$BIN/kueue" --config="$RUN/kueue.yaml" \
    --feature-gates=VisibilityOnDemand=false
  wait_for kubectl-proxy 30 curl -sf "http://127.0.0.1:$p_proxy/readyz"
  wait_for kube-controller-manager 60 curl -skf "https://127.0.0.1:$p_kcm/healthz"
  wait_for kube-scheduler 60 curl -skf "https://127.0.0.1:$p_sched/healthz"
  wait_for kueue 90 curl -sf "http://127.0.0.1:$p_health/readyz"
  webhooks "$p_hook"
  # Pods need the namespace's default ServiceAccount, which the controller manager creates.
  wait_for kube-controller-manager 60 kc -n "$NS" get serviceaccount default

  if [[ ${IRIS_K8S_NODES:-1} != 0 ]]; then
    IRIS_K8S_KUBELET_PORT=$p_kubelet "$SRC/nodes.sh" | kc apply -f - >/dev/null
  fi
  if [[ ${IRIS_K8S_KUEUE_OBJECTS:-1} != 0 ]]; then
    # The webhook server may still be warming up: retry the admin objects briefly.
    # IRIS_K8S_TOPOLOGY picks the flavor's Topology: infiniband (H100 clusters) or nvlink (GB200).
    sed "s/topologyName: infiniband/topologyName: ${IRIS_K8S_TOPOLOGY:-infiniband}/" \
      "$SRC/kueue-objects.yaml" >"$RUN/kueue-objects.yaml"
    wait_for kueue 30 kc apply -f "$RUN/kueue-objects.yaml"
  fi
  cat >"$RUN/env" <<EOF
export KUBECONFIG=$RUN/kubeconfig
export IRIS_K8S_HTTP_KUBECONFIG=$RUN/kubeconfig-http
export IRIS_K8S_NAMESPACE=$NS
export IRIS_K8S_KUBELET_PORT=$p_kubelet
EOF
  trap - EXIT
  log "up in $((SECONDS - t0)) s: API server https://127.0.0.1:$p_api, logs in $RUN/logs"
  envline
}

# On a failed `up`: keep the logs beside the run dir, stop what was started.
up_failed() {
  rm -rf "$RUN.logs"
  cp -r "$RUN/logs" "$RUN.logs" 2>/dev/null || true
  log "up failed; stopping what it started (logs kept in $RUN.logs)"
  down
}

envline() {
  [[ -f $RUN/env ]] || die "not up (no $RUN/env)"
  cat "$RUN/env"
}

down() {
  [[ -d $RUN ]] || return 0
  local f pid name n
  # Kueue first (its webhooks point at it), the API server after its clients, etcd last.
  for name in kueue kubectl-proxy kube-scheduler kube-controller-manager kube-apiserver etcd; do
    f=$RUN/pids/$name.pid
    [[ -f $f ]] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || continue
    for ((n = 0; n < 50; n++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  release_ports
  rm -rf "$RUN"
}

status() {
  local f name
  [[ -d $RUN/pids ]] || { echo "down"; return 0; }
  for f in "$RUN"/pids/*.pid; do
    name=$(basename "$f" .pid)
    if alive "$name"; then echo "$name: running (pid $(cat "$f"))"; else echo "$name: dead"; fi
  done
}

case ${1:-} in
  build) build; log "binaries in $BIN" ;;
  up) up ;;
  env) envline ;;
  down) down ;;
  status) status ;;
  bin) echo "$BIN" ;;
  *) echo "usage: $0 build|up|env|down|status|bin" >&2; exit 2 ;;
esac
