#!/usr/bin/env bash
# Prints the test cluster's Node objects (YAML) for `kubectl apply`: CoreWeave-shaped labels and
# capacities, Ready, with no kubelet behind them (kube-scheduler binds to them all the same).
#   IRIS_K8S_CPU_NODES (default 2), IRIS_K8S_H100_NODES (default 4, two per leafgroup),
#   IRIS_K8S_GB200_NODES (default 0; 4 GPUs each, 18 per NVL72 rack = NVLink domain, a rack per
#   leafgroup; the cluster then needs IRIS_K8S_TOPOLOGY=nvlink),
#   IRIS_K8S_LABEL_PREFIX (default iris: nodes carry iris-<prefix>-managed=true),
#   IRIS_K8S_KUBELET_PORT (default 10250: where the node agent serves container logs).
set -euo pipefail
PREFIX=${IRIS_K8S_LABEL_PREFIX:-iris}
NOW=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# node NAME CPU MEMORY GPUS FABRIC SUPERPOD LEAFGROUP NVLINK_LABEL_LINE [EXTRA_LABEL_LINES]
# (only GB200/GB300 nodes, and the synthetic CPU ones, carry an NVLink domain)
node() {
  local name=$1 cpu=$2 mem=$3 gpus=$4 fabric=$5 superpod=$6 leaf=$7 nvl=$8 extra=${9:-}
  local res="cpu: \"$cpu\"
      memory: $mem
      ephemeral-storage: 1Ti
      pods: \"110\""
  if ((gpus > 0)); then
    res+="
      nvidia.com/gpu: \"$gpus\"
      rdma/ib: \"$gpus\""
  fi
  cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: $name
  labels:
    kubernetes.io/hostname: $name
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    iris-$PREFIX-managed: "true"
    iris.kueue: "true"
    backend.coreweave.cloud/fabric: $fabric
    backend.coreweave.cloud/superpod: $superpod
    backend.coreweave.cloud/leafgroup: $leaf
$nvl
$extra
status:
  capacity:
      $res
  allocatable:
      $res
  addresses:
  - {type: InternalIP, address: 127.0.0.1}
  - {type: Hostname, address: $name}
  daemonEndpoints:
    kubeletEndpoint: {Port: ${IRIS_K8S_KUBELET_PORT:-10250}}
  conditions:
  - {type: Ready, status: "True", reason: KubeletReady, message: registered by k8s-testenv, lastHeartbeatTime: "$NOW", lastTransitionTime: "$NOW"}
  nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: v1.35.4, bootID: "", containerRuntimeVersion: "", kernelVersion: "", kubeProxyVersion: "", machineID: "", osImage: "", systemUUID: ""}
YAML
}

for ((i = 0; i < ${IRIS_K8S_CPU_NODES:-2}; i++)); do
  # CPU NodePools carry the synthetic iris-cpu-only value at every topology level.
  node "cpu-$i" 32 128Gi 0 iris-cpu-only iris-cpu-only iris-cpu-only "    ds.coreweave.com/nvlink.domain: iris-cpu-only"
done
for ((i = 0; i < ${IRIS_K8S_H100_NODES:-4}; i++)); do
  node "h100-$i" 128 2000Gi 8 ib-fabric-0 ib-superpod-0 "ib-leaf-$((i / 2))" "" \
    "    nvidia.com/gpu.product: H100
    gpu.nvidia.com/model: H100
    node.kubernetes.io/instance-type: gd-8xh100ib-i128"
done
for ((i = 0; i < ${IRIS_K8S_GB200_NODES:-0}; i++)); do
  rack=$((i / 18))
  node "gb200-$i" 144 900Gi 4 ib-fabric-0 ib-superpod-0 "ib-leaf-gb-$rack" \
    "    ds.coreweave.com/nvlink.domain: nvl72-rack-$rack" \
    "    nvidia.com/gpu.product: GB200
    gpu.nvidia.com/model: GB200
    node.kubernetes.io/instance-type: gb200-4x"
done
