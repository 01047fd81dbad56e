"""Pod manifests built by the PUBLISHED Kubernetes provider, for our parity test.

Prints a JSON list: one entry per case with the RunTaskRequest (binary protobuf, hex), the
provider settings it was built with, and the published ``_build_pod_manifest`` output with the
workdir-staging init container and volume ``_build_init_container_spec`` adds (joined as the
published provider joins them when it applies a pod).
``crates/kube-backend/src/parity.rs`` builds the same requests with our manifest code and
compares field by field (tests/compat/run.sh runs it).
"""

import json
import sys

from iris.cluster.backends.k8s import tasks
from iris.rpc import job_pb2

CONFIG = {
    "namespace": "iris",
    "default_image": "ghcr.io/marin-community/iris-task:2026.08",
    "cache_dir": "/mnt/local/iris-cache",
    "service_account": "iris-task",
    "controller_address": "http://iris-controller-svc.iris.svc.cluster.local:10000",
    "label_prefix": "cw",
    "task_env": {"MARIN_PREFIX": "s3://marin-cw/", "WANDB_MODE": "offline"},
}


def pod_config(host_network: bool) -> tasks.PodConfig:
    return tasks.PodConfig(
        namespace=CONFIG["namespace"],
        default_image=CONFIG["default_image"],
        cache_dir=CONFIG["cache_dir"],
        service_account=CONFIG["service_account"],
        host_network=host_network,
        controller_address=CONFIG["controller_address"],
        managed_label=f"iris-{CONFIG['label_prefix']}-managed",
        task_env=dict(CONFIG["task_env"]),
        local_queue=f"{CONFIG['label_prefix']}-lq",
    )


def request(
    task_id: str,
    *,
    num_tasks: int = 1,
    priority: int = job_pb2.PRIORITY_BAND_INTERACTIVE,
    cpu: int = 0,
    memory: int = 0,
    disk: int = 0,
    gpu: tuple[str, int] | None = None,
    tpu: str | None = None,
    group_by: str = "",
    env: dict | None = None,
    secrets: dict | None = None,
    setup: list | None = None,
    timeout_s: int = 0,
    ports: list | None = None,
    region: str | None = None,
    bundle: str = "",
    workdir_files: dict | None = None,
    workdir_file_refs: dict | None = None,
) -> job_pb2.RunTaskRequest:
    r = job_pb2.RunTaskRequest()
    r.task_id = task_id
    r.num_tasks = num_tasks
    r.attempt_id = 1
    r.attempt_uid = "0123456789abcdef"
    r.bundle_id = bundle
    r.task_token = "token-for-tests"
    r.priority = priority
    r.entrypoint.run_command.argv.extend(["python", "-m", "train", "--steps=10"])
    if cpu:
        r.resources.cpu_millicores = cpu
    if memory:
        r.resources.memory_bytes = memory
    if disk:
        r.resources.disk_bytes = disk
    if gpu:
        r.resources.device.gpu.variant = gpu[0]
        r.resources.device.gpu.count = gpu[1]
    if tpu:
        r.resources.device.tpu.variant = tpu
    if group_by:
        r.coscheduling.group_by = group_by
    for k, v in (env or {}).items():
        r.environment.env_vars[k] = v
    for k, v in (secrets or {}).items():
        r.environment.secrets[k] = v
    r.environment.setup_scripts.extend(setup or [])
    if timeout_s:
        r.timeout.milliseconds = timeout_s * 1000
    r.ports.extend(ports or [])
    for k, v in (workdir_files or {}).items():
        r.entrypoint.workdir_files[k] = v
    for k, v in (workdir_file_refs or {}).items():
        r.entrypoint.workdir_file_refs[k] = v
    if region:
        c = r.constraints.add()
        c.key = "region"
        c.op = job_pb2.CONSTRAINT_OP_EQ
        c.value.string_value = region
    return r


CASES = [
    (
        "cpu-coordinator",
        False,
        request(
            "/alice/coord/0",
            cpu=2000,
            memory=8 << 30,
            disk=20 << 30,
            env={"WANDB_MODE": "online"},
            secrets={"HF_TOKEN": "hf-secret", "CW_KEY_ID": "id", "CW_KEY_SECRET": "key"},
            setup=["uv sync --frozen"],
            timeout_s=600,
            ports=["http"],
            region="us-east-04a",
        ),
    ),
    (
        "h100-leafgroup-gang",
        True,
        request(
            "/alice/train/3",
            num_tasks=8,
            priority=job_pb2.PRIORITY_BAND_BATCH,
            cpu=32000,
            memory=256 << 30,
            gpu=("H100", 8),
            group_by="leafgroup",
            timeout_s=3600,
        ),
    ),
    (
        "h100-single",
        False,
        request(
            "/bob/eval/0",
            priority=job_pb2.PRIORITY_BAND_PRODUCTION,
            gpu=("H100", 1),
            bundle="5f2c0e",
        ),
    ),
    (
        "cpu-staged-workdir",
        False,
        request(
            "/dave/callable/0",
            cpu=1000,
            memory=2 << 30,
            bundle="9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            workdir_files={"_callable.pkl": b"\x80\x05N."},
            workdir_file_refs={"data/prompts.json": "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"},
        ),
    ),
    (
        "cpu-replicas-batch",
        False,
        request(
            "/bob/sweep/2",
            num_tasks=4,
            priority=job_pb2.PRIORITY_BAND_BATCH,
            cpu=500,
            memory=1 << 30,
            env={"A": "1"},
            secrets={"WANDB_API_KEY": "w"},
        ),
    ),
    (
        "tpu-single",
        False,
        request("/carol/jax/0", tpu="v5litepod-4", cpu=4000, timeout_s=120),
    ),
    (
        "gb200-sliced-gang",
        True,
        request(
            "/alice/big/17",
            num_tasks=32,
            priority=job_pb2.PRIORITY_BAND_PRODUCTION,
            gpu=("GB200", 4),
            group_by="nvlink.domain.sliced",
        ),
    ),
]


def main() -> None:
    out = []
    for name, host_network, req in CASES:
        cfg = pod_config(host_network)
        pod = tasks._build_pod_manifest(req, cfg)
        pod_name = pod["metadata"]["name"]
        init, volumes, _ = tasks._build_init_container_spec(req, pod_name, cfg.default_image, cfg.controller_address)
        pod["spec"]["initContainers"] = init + pod["spec"].get("initContainers", [])
        pod["spec"]["volumes"].extend(volumes)
        out.append(
            {
                "case": name,
                "host_network": host_network,
                "request": req.SerializeToString().hex(),
                "config": CONFIG,
                "pod": pod,
            }
        )
    json.dump(out, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
