#!/usr/bin/env bash
# Brings up a single-node Kubernetes cluster for the tests, on this machine, beside the
# Docker engine and apart from it: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, a kubelet on a containerd of its own, kube-proxy (nftables),
# kube-router's NetworkPolicy controller (enforces NetworkPolicy), and a hostPath volume provisioner
# (storage class sk-hostpath, the default). The project's test image is imported into
# the node (no registry is reachable). Idempotent: run again, it starts what is not
# running and leaves the rest as it is.
# Prints the admin KUBECONFIG path on its last line; .ci/kube-down.sh removes it all.
#
# Settings (environment): SK_KUBE_STATE (/tmp/sk-kube), SK_KUBE_BIN (see kube-build.sh;
# built when missing), SK_KUBE_IMAGES (the Docker images to import, space-separated;
# default: $SANDBOX_KERNEL_TEST_IMAGE or sandbox-kernel-test:bookworm).
#
# What this machine needs, measured (see docs/operators/kubernetes.md):
# containerd's restrict_oom_score_adj (no CAP_SYS_RESOURCE here), cgroupfs on cgroup v1,
# the pause image built locally, pod traffic allowed on our bridge and kept off every
# other interface (nothing a pod sends leaves the machine).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state=${SK_KUBE_STATE:-/tmp/sk-kube}
images=${SK_KUBE_IMAGES:-${SANDBOX_KERNEL_TEST_IMAGE:-sandbox-kernel-test:bookworm}}
node=sk-kube
bridge=skkube0
pod_cidr=10.244.0.0/24
service_cidr=10.96.0.0/24
service_ip=10.96.0.1
chain=SK-KUBE-FORWARD
log() { echo "kube-up: $*" >&2; }
die() { log "$*"; exit 1; }

running() { [ -f "$state/pids/$1" ] && kill -0 "$(cat "$state/pids/$1")" 2>/dev/null; }
[ "$(id -u)" = 0 ] || die "needs root (a kubelet, containerd, iptables)"
for cmd in etcd containerd runc ctr openssl gcc nft iptables ipset; do
  command -v "$cmd" >/dev/null || die "$cmd is missing (Debian: etcd-server containerd runc openssl gcc nftables iptables ipset)"
done
[ -x /usr/lib/cni/bridge ] || die "the CNI plugins are missing (Debian: containernetworking-plugins)"
start=$SECONDS
bin=$(bash "$here/kube-build.sh" | tail -1)
log "binaries in $bin ($((SECONDS - start)) s)"
export PATH="$bin:$PATH"

mkdir -p "$state"/{pki,pids,logs,etcd,containerd,cni/net.d,cni/ipam,kubelet,volumes}
cd "$state"
node_ip=${SK_KUBE_NODE_IP:-$(ip -4 -o addr show scope global | awk '$2 != "'$bridge'" {sub(/\/.*/, "", $4); print $4; exit}')}
[ -n "$node_ip" ] || die "no non-loopback IPv4 address for the node"
echo "$node_ip" >node-ip
api="https://$node_ip:6443"

# -- certificates ---------------------------------------------------------------------------
pki=$state/pki
if [ ! -f "$pki/ca.crt" ]; then
  log "certificates"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=sk-kube-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  client() {  # client NAME CN [ORG]
    local subj="/CN=$2"
    [ -n "${3:-}" ] && subj="/O=$3$subj"
    openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
    openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 30 -out "$pki/$1.crt" -extfile <(printf 'extendedKeyUsage=clientAuth\n') 2>/dev/null
  }
  client admin sk-kube-admin system:masters
  client controller-manager system:kube-controller-manager
  client scheduler system:kube-scheduler
  client kubelet "system:node:$node" system:nodes
  client kube-proxy system:kube-proxy
  client apiserver-kubelet apiserver-kubelet-client system:masters
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -out "$pki/apiserver.crt" 2>/dev/null -extfile <(printf '%s\n' \
      "subjectAltName=IP:$node_ip,IP:127.0.0.1,IP:$service_ip,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
      "extendedKeyUsage=serverAuth")
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  echo "$api" >"$pki/server"
  rm -f "$pki"/*.csr
fi
kubeconfig() {  # kubeconfig NAME: a kubeconfig with the client certificate NAME
  cat >"$state/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sk-kube
  cluster: {server: "$api", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$pki/$1.crt", client-key: "$pki/$1.key"}
contexts:
- name: sk-kube
  context: {cluster: sk-kube, user: $1, namespace: default}
current-context: sk-kube
EOF
}
for name in admin controller-manager scheduler kubelet kube-proxy; do kubeconfig "$name"; done

write() {  # write FILE: stdin into FILE, left untouched when the same (daemons watch theirs)
  local new
  new=$(cat)
  [ -f "$1" ] && [ "$(cat "$1")" = "$new" ] && return 0
  printf '%s\n' "$new" >"$1"
}
daemon() {  # daemon NAME COMMAND...: started in the background, its pid recorded
  local name=$1
  shift
  running "$name" && return 0
  setsid "$@" >"$state/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$state/pids/$name"
}
wait_for() {  # wait_for WHAT SECONDS COMMAND...
  local what=$1 limit=$2
  shift 2
  for _ in $(seq $((limit * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "$what did not come up in $limit s (logs: $state/logs)"
}
admin_curl() {
  curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$@"
}

# -- control plane -----------------------------------------------------------------------
log "etcd, kube-apiserver"
daemon etcd etcd --name sk-kube --data-dir "$state/etcd/data" \
  --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster sk-kube=http://127.0.0.1:23800 --quota-backend-bytes 2147483648
daemon kube-apiserver kube-apiserver --etcd-servers http://127.0.0.1:23790 \
  --bind-address "$node_ip" --advertise-address "$node_ip" --secure-port 6443 \
  --service-cluster-ip-range "$service_cidr" --authorization-mode Node,RBAC \
  --client-ca-file "$pki/ca.crt" --tls-cert-file "$pki/apiserver.crt" \
  --tls-private-key-file "$pki/apiserver.key" \
  --kubelet-client-certificate "$pki/apiserver-kubelet.crt" \
  --kubelet-client-key "$pki/apiserver-kubelet.key" --kubelet-preferred-address-types InternalIP \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc --profiling=false \
  --enable-admission-plugins NodeRestriction
wait_for kube-apiserver 90 admin_curl "$api/readyz"

log "controller-manager, scheduler"
daemon kube-controller-manager kube-controller-manager --kubeconfig "$state/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$state/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$state/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 10257 --leader-elect=false \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --use-service-account-credentials \
  --profiling=false
daemon kube-scheduler kube-scheduler --kubeconfig "$state/scheduler.kubeconfig" \
  --authentication-kubeconfig "$state/scheduler.kubeconfig" \
  --authorization-kubeconfig "$state/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 10259 --leader-elect=false --profiling=false

# -- the node: containerd, CNI, kubelet ---------------------------------------------------
ctrd=$state/containerd
sock=$ctrd/containerd.sock
if [ ! -f "$ctrd/config.toml" ]; then
  cat >"$ctrd/config.toml" <<EOF
version = 2
root = "$ctrd/root"
state = "$ctrd/state"
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$ctrd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/sk-kube/pause:1"
  # No CAP_SYS_RESOURCE on these machines: runc may not lower a process's OOM score.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$ctrd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni/net.d"
EOF
fi
write "$state/cni/net.d/10-sk-kube.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "sk-kube",
  "plugins": [
    {
      "type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false,
      "hairpinMode": true,
      "ipam": {"type": "host-local", "dataDir": "$state/cni/ipam",
               "ranges": [[{"subnet": "$pod_cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
# Network namespaces there before us are not ours to remove on the way down.
[ -f "$state/netns-before" ] || ls /run/netns 2>/dev/null >"$state/netns-before" || true
log "containerd"
daemon containerd containerd --config "$ctrd/config.toml"
wait_for containerd 30 ctr -a "$sock" version

log "images: the pause image, ${images}"
if ! ctr -a "$sock" -n k8s.io images check "name==docker.io/sk-kube/pause:1" | grep -q pause; then
  gcc -static -O2 -o "$state/pause" "$here/kube/pause.c"
  python3 -I "$here/kube/pause-image.py" "$state/pause" sk-kube/pause:1 "$state/pause.tar"
  ctr -a "$sock" -n k8s.io images import "$state/pause.tar" >/dev/null
fi
for image in $images; do
  full=$image
  case "${image%%/*}" in *.*|*:*|localhost) ;; *) full="docker.io/$( [[ $image == */* ]] || echo library/)$image" ;; esac
  want=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null) \
    || die "image $image is missing from Docker (.ci/build-test-image.sh makes the test image)"
  have=$(ctr -a "$sock" -n k8s.io images ls -q "name==$full" 2>/dev/null | head -1)
  if [ -z "$have" ] || [ "$(cat "$state/image-$(echo "$image" | tr '/:' '__')" 2>/dev/null)" != "$want" ]; then
    docker save "$image" | ctr -a "$sock" -n k8s.io images import - >/dev/null
    echo "$want" >"$state/image-$(echo "$image" | tr '/:' '__')"
  fi
done

log "kubelet"
for made in /var/log/pods /var/log/containers; do
  [ -e "$made" ] || [ -f "$state/made-$(basename "$made")" ] || echo "$made" >"$state/made-$(basename "$made")"
done
# Its own cgroup root, so the way down knows what is ours.
for controller in /sys/fs/cgroup/*/; do
  case "$controller" in */unified/) continue ;; esac
  [ -e "$controller/cgroup.procs" ] && mkdir -p "$controller/sk-kube"
done
touch "$state/resolv.conf"  # pods get no name servers: nothing may go off this machine
write "$state/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
cgroupRoot: /sk-kube
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$sock
resolvConf: $state/resolv.conf
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: Webhook}
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 250
podPidsLimit: 4096
protectKernelDefaults: false
EOF
daemon kubelet env AWS_EC2_METADATA_DISABLED=true kubelet --config "$state/kubelet/config.yaml" \
  --kubeconfig "$state/kubelet.kubeconfig" --root-dir "$state/kubelet/root" \
  --hostname-override "$node" --node-ip "$node_ip" --cert-dir "$state/kubelet/pki"

# -- traffic: pods reach each other and this machine, nothing beyond ----------------------
# Off the bridge is dropped in a chain that runs before every filter chain (and before
# kube-router's, which accepts what a policy allows), so no pod packet leaves the machine.
nft -f - <<EOF
table ip sk-kube
delete table ip sk-kube
table ip sk-kube {
  chain forward {
    type filter hook forward priority -10; policy accept;
    iifname "$bridge" oifname != "$bridge" drop
    oifname "$bridge" iifname != "$bridge" drop
  }
}
EOF
# Docker's FORWARD policy is DROP: pod to pod on our bridge is let through.
iptables -N "$chain" 2>/dev/null || iptables -F "$chain"
iptables -A "$chain" -i "$bridge" -o "$bridge" -j ACCEPT
iptables -C FORWARD -j "$chain" 2>/dev/null || iptables -A FORWARD -j "$chain"

write "$state/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: "$state/kube-proxy.kubeconfig"}
hostnameOverride: $node
clusterCIDR: $pod_cidr
bindAddress: $node_ip
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$node_ip/32"]
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
log "kube-proxy, volumes"
daemon kube-proxy kube-proxy --config "$state/kube-proxy.yaml"
daemon hostpath python3 -I "$here/kube/hostpath-provisioner.py" "$pki" "$state/volumes"

export KUBECONFIG=$state/admin.kubeconfig
node_ready() {
  admin_curl "$api/api/v1/nodes/$node" | python3 -I -c '
import json, sys
node = json.load(sys.stdin)
sys.exit(0 if any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]) else 1)'
}
wait_for "the node" 120 node_ready
log "kube-router (network policies)"
# Only kube-router's firewall: policies become iptables rules and ipsets of its own.
daemon kube-router kube-router --kubeconfig "$state/admin.kubeconfig" --hostname-override "$node" \
  --run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
  --enable-cni=false --enable-ibgp=false --enable-overlay=false \
  --service-cluster-ip-range "$service_cidr" --health-port 0 --metrics-port 0 --v 1
apply() {  # apply PATH BODY: create an object unless it is there
  local code
  code=$(admin_curl -o /dev/null -w '%{http_code}' "$api$1" 2>/dev/null || true)
  [ "$code" = 200 ] && return 0
  admin_curl -X POST -H 'Content-Type: application/json' -d "$2" "${api}${1%/*}" >/dev/null
}
# Bound when a pod first uses a claim (as local and zonal storage are): a pod is never
# held back as "unschedulable" for a claim that binds a moment after it was made.
apply /apis/storage.k8s.io/v1/storageclasses/sk-hostpath '{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass",
  "metadata":{"name":"sk-hostpath","annotations":{"storageclass.kubernetes.io/is-default-class":"true"}},
  "provisioner":"sandbox-kernel.test/hostpath","reclaimPolicy":"Delete","volumeBindingMode":"WaitForFirstConsumer"}'
wait_for "the default service account" 60 admin_curl "$api/api/v1/namespaces/default/serviceaccounts/default"
sleep 1  # a daemon that cannot run ends at once: say so here rather than in a test
for name in kube-proxy kube-router hostpath kube-controller-manager kube-scheduler; do
  running "$name" || die "$name stopped (log: $state/logs/$name.log)"
done
log "up in $((SECONDS - start)) s: $api, node $node ($node_ip), state in $state"
echo "$state/admin.kubeconfig"
