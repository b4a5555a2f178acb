#!/usr/bin/env bash
# Removes the test cluster .ci/kube-up.sh made, and everything it left on this machine:
# its pods (through the API while it answers), the kubelet, its containerd and that
# containerd's shims (found by its own socket path), the control plane (by recorded pid),
# mounts under its state folder, the pods' network namespaces, the bridge, its iptables
# chain and nftables tables, its cgroups, its pod logs, and the state folder. Leaves the
# Docker engine, its containerd, its shims (/run/containerd/s is shared) and its
# networks alone. The binaries (.ci/kube-build.sh) are kept.
set -uo pipefail
state=${SK_KUBE_STATE:-/tmp/sk-kube}
bridge=skkube0
chain=SK-KUBE-FORWARD
log() { echo "kube-down: $* (${SECONDS}s)" >&2; }
[ -d "$state" ] || { log "nothing to remove ($state does not exist)"; exit 0; }
pid_of() { [ -f "$state/pids/$1" ] && cat "$state/pids/$1"; }
alive() { local p; p=$(pid_of "$1") && kill -0 "$p" 2>/dev/null; }
stop() {  # stop NAME...: TERM their process groups, at most 5 s later KILL what is left
  local name p pids=()
  for name in "$@"; do
    p=$(pid_of "$name") || continue
    kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null
    pids+=("$p")
    rm -f "$state/pids/$name"
  done
  for _ in $(seq 50); do
    local left=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; done
}

# Pods first, through the API, so the kubelet tears their sandboxes down itself.
if alive kube-apiserver && alive kubelet && [ -f "$state/admin.kubeconfig" ]; then
  api=$(cat "$state/pki/server")
  curl_api() { curl -fsS --max-time 20 --cacert "$state/pki/ca.crt" --cert "$state/pki/admin.crt" --key "$state/pki/admin.key" "$@"; }
  for ns in $(curl_api "$api/api/v1/namespaces" | python3 -I -c 'import json,sys; print(" ".join(i["metadata"]["name"] for i in json.load(sys.stdin)["items"]))'); do
    curl_api -X DELETE "$api/api/v1/namespaces/$ns/pods?gracePeriodSeconds=0" >/dev/null 2>&1
  done
  for _ in $(seq 60); do
    left=$(curl_api "$api/api/v1/pods" | python3 -I -c 'import json,sys; print(len(json.load(sys.stdin)["items"]))' 2>/dev/null || echo 0)
    [ "$left" = 0 ] && break
    sleep 0.5
  done
fi
log "pods removed"
stop kubelet hostpath kube-router kube-proxy

# The containerd's own shims: each holds the socket path of the containerd that made it.
sock=$state/containerd/containerd.sock
if [ -S "$sock" ] && command -v ctr >/dev/null; then
  for id in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -a "$sock" -n k8s.io tasks kill -s KILL "$id" >/dev/null 2>&1
  done
fi
stop containerd
for pid in $(pgrep -f containerd-shim 2>/dev/null); do
  if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-address $sock"; then
    kill -KILL "$pid" 2>/dev/null
  fi
done
log "node stopped"
stop kube-scheduler kube-controller-manager kube-apiserver
stop etcd

# What the node left on the machine.
grep -F " $state/" /proc/self/mounts | awk '{print $2}' | sort -r | while read -r target; do
  umount -l "$target" 2>/dev/null
done
for netns in $(ls /run/netns 2>/dev/null); do
  case "$netns" in cni-*) ;; *) continue ;; esac
  grep -qxF "$netns" "$state/netns-before" 2>/dev/null && continue
  umount "/run/netns/$netns" 2>/dev/null
  rm -f "/run/netns/$netns"
done
ip link delete "$bridge" 2>/dev/null
iptables -D FORWARD -j "$chain" 2>/dev/null
iptables -F "$chain" 2>/dev/null
iptables -X "$chain" 2>/dev/null
for table in "ip sk-kube" "ip kube-proxy" "ip6 kube-proxy"; do
  nft delete table $table 2>/dev/null
done
# Chains of the kubelet (KUBE-FIREWALL, canaries) and kube-router (its --cleanup-config
# would also clear every IPVS service of the machine: not ours to touch). No other
# Kubernetes runs here: every KUBE-* chain is this cluster's.
for table in filter nat mangle raw; do
  iptables -t "$table" -S 2>/dev/null | grep -E '^-A (INPUT|FORWARD|OUTPUT|PREROUTING|POSTROUTING) .*-j KUBE-' \
    | sed 's/^-A /-D /' | while read -r rule; do eval iptables -t "$table" "$rule" 2>/dev/null; done
  chains=$(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}')
  for c in $chains; do iptables -t "$table" -F "$c" 2>/dev/null; done
  for c in $chains; do iptables -t "$table" -X "$c" 2>/dev/null; done
done
for set in $(ipset list -n 2>/dev/null | grep -E '^KUBE-(SRC|DST)-|^kube-router-'); do
  ipset destroy "$set" 2>/dev/null
done
for controller in /sys/fs/cgroup/*/sk-kube; do
  [ -d "$controller" ] || continue
  find "$controller" -depth -type d -exec rmdir {} \; 2>/dev/null
done
for pod_logs in /var/log/pods/*; do
  [ -d "$pod_logs" ] || continue
  # Ours: the kubelet's root under $state knew them.
  [ -d "$state/kubelet/root/pods/${pod_logs##*_}" ] && rm -rf "$pod_logs"
done
for made in "$state"/made-pods "$state"/made-containers; do
  [ -f "$made" ] && rm -rf "$(cat "$made")"
done
if [ -n "${SK_KUBE_LOGS:-}" ] && [ -d "$state/logs" ]; then  # kept for whoever reads CI's logs
  mkdir -p "$SK_KUBE_LOGS" && cp -r "$state/logs/." "$SK_KUBE_LOGS/"
fi
rm -rf "$state"
log "removed"
