"""Mixed federations: our controller and the PUBLISHED Python controller (marin-iris) as hub and
peer, in every pairing, driven with the published CLI.

    python federation_test.py --ours target/debug/iris --published .venv-compat/bin/iris

Each pairing starts a peer (GPU capacity) and a hub (CPU) on 127.0.0.1 from published-format
configs, then runs the same scenarios: the hub lists the peer as reachable, in the reference's
backend shape; a CPU job runs on the hub; an unpinned GPU job is routed to the peer; a pinned job
runs on the peer and its end is mirrored to the hub; a cancel on the hub ends it on the peer; a
submitter the peer does not admit is refused with the peer's reason; a pin to an unknown peer is
refused at submit; a child job pinned to the peer is refused, naming the peer and the remedy; a
peer killed with kill -9 is seen unreachable, then back, and takes jobs
again. Where a published controller cannot take part in one, the pairing leaves it out and says
why at that line. Prints one line per scenario and `N passed, M failed`; exits 1 on any failure.

Logs: a Python peer serves logs to a hub only through finelog's own forwarding (its `/proxy` refuses
a federation bearer for `/system/log-server`), so logs through the hub are checked where the peer
is ours; with a Python peer the hub's error must say what the peer answered.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import httpx

from harness import PROCS, fail, spawn, wait_until

RESULTS = []


class Node:
    """One controller: its URL, kind ("ours" / "published") and the processes behind it."""

    def __init__(self, name, kind, url, procs):
        self.name, self.kind, self.url, self.procs = name, kind, url, procs

    def rpc(self, method, body, token=None):
        headers = {"content-type": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        r = httpx.post(
            f"{self.url}/iris.cluster.ControllerService/{method}",
            content=json.dumps(body),
            headers=headers,
            timeout=30,
        )
        if r.status_code != 200:
            fail(f"{self.name} {method}: HTTP {r.status_code} {r.text[:300]}")
        return r.json()

    def job(self, job_id, token=None):
        """The job's status, or None when this controller does not know it."""
        headers = {"content-type": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        r = httpx.post(
            f"{self.url}/iris.cluster.ControllerService/GetJobStatus",
            content=json.dumps({"jobId": job_id}),
            headers=headers,
            timeout=30,
        )
        if r.status_code != 200:
            return None
        return r.json().get("job")

    def state(self, job_id, token=None):
        j = self.job(job_id, token)
        return (j or {}).get("state", "").replace("JOB_STATE_", "").lower() or None

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT if self.kind == "published" else signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def indent(pem, n):
    return "".join(" " * n + line + "\n" for line in pem.strip().splitlines())


class Fed:
    def __init__(self, ours, published, work):
        self.ours, self.published, self.work = ours, published, Path(work)
        self.ws = self.work / "ws"
        self.ws.mkdir(parents=True, exist_ok=True)
        self.serve_args = {}
        (self.ws / "README").write_text("federation compat workspace\n")

    def keys(self, name):
        out = subprocess.run(
            [self.ours, "cluster", "init-keys", "--out-file", str(self.work / f"{name}.pem")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        pub = re.search(r"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", out, re.S)
        return self.work / f"{name}.pem", pub.group(0)

    def token(self, hub_key, user):
        out = subprocess.run(
            [self.ours, "user", "token", "mint", user, "--signing-key", f"file:{hub_key}", "--issuer", "hub"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return out.strip().splitlines()[-1].strip()

    def published_cluster(self, name, yaml):
        """`iris --config <yaml> cluster start --local` of the published package; its URL."""
        cfg = self.work / f"{name}.yaml"
        cfg.write_text(yaml)
        log = self.work / f"{name}.log"
        p = spawn([self.published, "--config", str(cfg), "cluster", "start", "--local"], log, cwd=self.ws)

        def url():
            if p.poll() is not None:
                fail(f"{name} exited: {log.read_text()[-2000:]}")
            m = re.search(r"Controller started at (http://127\.0\.0\.1:\d+)", log.read_text())
            return m and m.group(1)

        return Node(name, "published", wait_until(f"{name} to start", url, timeout=180), [p])

    def our_cluster(self, name, yaml, device=None, extra=()):
        """Our `cluster controller serve` plus one worker daemon; its URL."""
        cfg = self.work / f"{name}.yaml"
        cfg.write_text(yaml)
        state = self.work / f"{name}-state"
        ctl = spawn(
            [self.ours, "cluster", "controller", "serve", "--state-dir", str(state), "--bind", "127.0.0.1:0",
             "--config", str(cfg), *extra],
            self.work / f"{name}.log",
            cwd=self.ws,
        )

        def url():
            if ctl.poll() is not None:
                fail(f"{name} exited: {(self.work / f'{name}.log').read_text()[-2000:]}")
            f = state / "controller.url"
            return f.exists() and f.read_text().strip()

        u = wait_until(f"{name} to start", url, timeout=60)
        self.serve_args[name] = [self.ours, "cluster", "controller", "serve", "--state-dir", str(state), "--bind",
                                 u.removeprefix("http://"), "--config", str(cfg), *extra]
        worker = [self.ours, "--controller-url", u, "worker", "serve", "--worker-id", f"{name}-w0", "--cpu", "8",
                  "--memory", "16GB", "--cache-dir", str(self.work / f"{name}-cache")]
        if device:
            worker += ["--device", device]
        w = spawn(worker, self.work / f"{name}-worker.log", cwd=self.ws)
        node = Node(name, "ours", u, [ctl, w])
        wait_until(f"{name}'s worker", lambda: node.rpc("ListWorkers", {}).get("workers"), timeout=60)
        return node

    # ---- configs (the published format: both controllers load them unchanged) ----

    def peer(self, kind, name, hub_pub):
        key, _ = self.keys(name)
        # trusted_cidrs: without a login provider or CIDRs the published controller runs
        # null-auth and does not check handoffs at all; loopback is its operators' network.
        auth = (
            f"auth:\n  signing_key: file:{key}\n  trusted_cidrs: [127.0.0.1/32]\n  allowed_submitters: [alice]\n"
            f"  federation_peers:\n    hub: |\n{indent(hub_pub, 6)}"
        )
        if kind == "published":
            return self.published_cluster(
                name,
                f"name: {name}\nplatform: {{local: {{}}}}\ncontroller: {{local: {{port: 0}}}}\nworker_provider: {{}}\n"
                f"{auth}"
                "scale_groups:\n  h100:\n    num_vms: 1\n    buffer_slices: 0\n    max_slices: 1\n"
                "    resources: {cpu: 8, ram: 16GB, disk: 20GB, device_type: gpu, device_variant: H100, "
                "device_count: 8, capacity_type: on-demand}\n    slice_template:\n      num_vms: 1\n      local: {}\n",
            )
        return self.our_cluster(name, f"name: {name}\n{auth}", device="gpu:H100:8")

    def hub(self, kind, key, peer):
        peers = f"peers:\n  {peer.name}:\n    controller_address: {peer.url}\n"
        # trusted_cidrs: a published hub in null-auth ignores bearer tokens (every caller is the
        # anonymous admin, whose jobs never federate); with CIDRs it verifies them.
        auth = f"auth:\n  signing_key: file:{key}\n  trusted_cidrs: [127.0.0.1/32]\n"
        if kind == "published":
            # The published `cluster start --local` does not wire `peers:`; its
            # `cluster controller serve` does (and needs a remote state dir).
            cfg = self.work / "hub.yaml"
            cfg.write_text(
                f"name: hub\nplatform: {{local: {{}}}}\nworker_provider: {{}}\n{auth}{peers}"
                f"storage:\n  remote_state_dir: file://{self.work}/hub-remote\n"
                "scale_groups:\n  cpu:\n    num_vms: 1\n    buffer_slices: 0\n    max_slices: 1\n"
                "    resources: {cpu: 4, ram: 8GB, disk: 20GB, device_type: cpu, device_variant: cpu, "
                "capacity_type: on-demand}\n    slice_template:\n      num_vms: 1\n      local: {}\n"
            )
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            log = self.work / "hub.log"
            p = spawn(
                [self.published, "--config", str(cfg), "cluster", "controller", "serve", "--host", "127.0.0.1",
                 "--port", str(port), "--state-dir", str(self.work / "hub-state")],
                log,
                cwd=self.ws,
            )
            node = Node("hub", "published", f"http://127.0.0.1:{port}", [p])

            def up():
                if p.poll() is not None:
                    fail(f"the published hub exited: {log.read_text()[-2000:]}")
                return node.rpc("ListPeers", {})

            wait_until("the published hub to answer", up, timeout=180)
            return node
        return self.our_cluster(
            "hub",
            f"name: hub\n{auth}{peers}",
            extra=("--federation-heartbeat", "0.5", "--federation-sync-interval", "0.3"),
        )

    def kill_and_restart(self, node):
        """kill -9 of our controller (its worker keeps running), then the same serve again."""
        ctl = node.procs[0]
        ctl.kill()
        ctl.wait()
        return lambda: node.procs.__setitem__(
            0, spawn(self.serve_args[node.name], self.work / f"{node.name}-restart.log", cwd=self.ws)
        )

    def cli(self, hub, token, *args, check=True):
        r = subprocess.run(
            [self.published, "--controller-url", hub.url, *args],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=self.ws,
            env={**os.environ, "MARIN_CLUSTER_TOKEN": token},
        )
        if check and r.returncode != 0:
            fail(f"iris {' '.join(args)} exited {r.returncode}: {r.stdout[-800:]}{r.stderr[-1500:]}")
        return r


def pairing(f, hub_kind, peer_kind):
    tag = f"{hub_kind} hub, {peer_kind} peer"
    hub_key, hub_pub = f.keys("hub")
    peer = f.peer(peer_kind, "gpu-peer", hub_pub)
    hub = f.hub(hub_kind, hub_key, peer)
    alice, bob = f.token(hub_key, "alice"), f.token(hub_key, "bob")
    nodes = [hub, peer]

    def scenario(name, fn):
        t = time.time()
        try:
            fn()
            RESULTS.append((True, f"{tag}: {name}"))
            print(f"ok   {tag}: {name} ({time.time() - t:.1f}s)", flush=True)
        except Exception as e:
            RESULTS.append((False, f"{tag}: {name}"))
            print(f"FAIL {tag}: {name}: {e}", flush=True)
            traceback.print_exc()
            for log in sorted(f.work.glob("*.log")):
                print(f"---- {log.name} (tail) ----\n{log.read_text()[-1500:]}", flush=True)

    def listed():
        peers = hub.rpc("ListPeers", {}, alice).get("peers", [])
        p = next((p for p in peers if p.get("peerId") == peer.name), None)
        if p is None:
            fail(f"ListPeers has no {peer.name}: {peers}")
        return p.get("reachable") is True and p

    def reachable():
        p = wait_until(f"{peer.name} reachable on the hub", listed, timeout=90)
        b = (p.get("backends") or [{}])[0]
        if b.get("backendId") != "default" or b.get("kind") != "worker-daemon":
            fail(f"the peer's backend is not the reference's worker-daemon shape: {b}")

    def submit(token, name, *cmd, flags=None):
        if flags is None:
            flags = ["--target-cluster", peer.name]
        r = f.cli(hub, token, "job", "run", "--no-wait", "--job-name", name, *flags, "--", *cmd)
        ids = re.findall(r"/[\w.@-]+/" + re.escape(name), r.stdout + r.stderr)
        if not ids:
            fail(f"no job id in the output of job run: {r.stdout[-500:]}{r.stderr[-500:]}")
        return ids[-1]

    def pinned_job_runs_on_the_peer_and_is_mirrored():
        job = submit(alice, "fed-ok", "sh", "-c", "echo fed-ok-line")
        if not job.startswith("/alice/"):
            fail(f"the hub did not take the token's user: {job}")
        wait_until("the job to succeed on the peer", lambda: peer.state(job) == "succeeded", timeout=180)
        wait_until("the hub to mirror its end", lambda: hub.state(job, alice) == "succeeded", timeout=120)
        logs = f.cli(hub, alice, "job", "logs", job, check=False)
        if peer_kind == "ours" and hub_kind == "ours":
            if "fed-ok-line" not in logs.stdout:
                fail(f"logs through the hub: {logs.stdout[-500:]}{logs.stderr[-500:]}")
        elif hub_kind == "ours" and "(unknown)" in logs.stdout + logs.stderr:
            fail(f"the hub's log error does not say what the peer answered: {logs.stderr[-500:]}")

    def cancel_on_the_hub_ends_it_on_the_peer():
        job = submit(alice, "fed-cancel", "sleep", "600")
        wait_until("the job to run on the peer", lambda: peer.state(job) == "running", timeout=180)
        f.cli(hub, alice, "job", "cancel", job)
        wait_until("the peer to end it", lambda: peer.state(job) == "killed", timeout=120)
        wait_until("the hub to show it ended", lambda: hub.state(job, alice) == "killed", timeout=120)

    def a_submitter_the_peer_refuses_is_told_why():
        job = submit(bob, "fed-refused", "true")

        def ended():
            j = hub.job(job, bob) or {}
            st = j.get("state", "")
            return st not in ("", "JOB_STATE_PENDING", "JOB_STATE_RUNNING") and j

        j = wait_until("the hub to end the refused job", ended, timeout=120)
        if "bob" not in json.dumps(j):
            fail(f"the refusal does not name the submitter: {j}")
        if peer.state(job) is not None:
            fail("the peer ran a job from a submitter it does not admit")

    def a_pin_to_an_unknown_peer_is_refused():
        r = f.cli(hub, alice, "job", "run", "--no-wait", "--job-name", "fed-nowhere", "--target-cluster",
                  "nowhere", "--", "true", check=False)
        if r.returncode == 0:
            fail(f"accepted a pin to an unknown peer: {r.stdout}")
        if "nowhere" not in r.stdout + r.stderr:
            fail(f"the refusal does not name the pin: {r.stderr[-500:]}")

    def a_child_job_pinned_to_the_peer_is_refused_naming_it():
        # Only whole root jobs federate: a child submitted under a live parent on the hub, pinned
        # to the peer, is refused at submit with the peer's name and the remedy (a root job).
        parent = submit(alice, "fed-parent", "sleep", "600", flags=[])
        wait_until("the parent to be known to the hub", lambda: hub.state(parent, alice) is not None, timeout=60)
        body = {
            "name": f"{parent}/pinned-child",
            "entrypoint": {"runCommand": {"argv": ["true"]}},
            "resources": {"cpuMillicores": 1000, "memoryBytes": "1073741824"},
            "replicas": 1,
            "constraints": [{"key": "cluster", "op": "CONSTRAINT_OP_EQ", "value": {"stringValue": peer.name}}],
        }
        r = httpx.post(
            f"{hub.url}/iris.cluster.ControllerService/LaunchJob",
            content=json.dumps(body),
            headers={"content-type": "application/json", "authorization": f"Bearer {alice}"},
            timeout=30,
        )
        try:
            if r.status_code == 200:
                fail(f"the hub accepted a child pinned to {peer.name}: {r.text[:300]}")
            msg = r.json().get("message", "")
            if peer.name not in msg or "root job" not in msg or "--target-cluster" not in msg:
                fail(f"the refusal does not name the peer and the remedy: HTTP {r.status_code} {r.text[:400]}")
            if peer.state(f"{parent}/pinned-child") is not None:
                fail("the refused child reached the peer")
        finally:
            f.cli(hub, alice, "job", "cancel", parent, check=False)

    def a_cpu_job_runs_on_the_hub():
        job = submit(alice, "fed-local", "true", flags=[])
        wait_until("the job to succeed on the hub", lambda: hub.state(job, alice) == "succeeded", timeout=180)
        if peer.state(job) is not None:
            fail("a CPU job the hub can run went to the peer")

    def a_gpu_job_is_routed_to_the_peer():
        job = submit(alice, "fed-gpu", "true", flags=["--enable-extra-resources", "--gpu", "H100x1"])
        wait_until("the GPU job to succeed on the peer", lambda: peer.state(job) == "succeeded", timeout=180)
        wait_until("the hub to mirror its end", lambda: hub.state(job, alice) == "succeeded", timeout=120)

    def a_killed_peer_is_seen_unreachable_and_back():
        restart = f.kill_and_restart(peer)
        # A published hub heartbeats every 30 s: allow two rounds each way.
        wait_until("the hub to see the peer unreachable", lambda: not listed_reachable(), timeout=90)
        restart()
        wait_until("the hub to see the peer again", listed_reachable, timeout=90)
        job = submit(alice, "fed-after-restart", "true")
        wait_until("a job after the restart to succeed on the peer", lambda: peer.state(job) == "succeeded",
                   timeout=180)
        wait_until("the hub to mirror it", lambda: hub.state(job, alice) == "succeeded", timeout=120)

    def listed_reachable():
        peers = hub.rpc("ListPeers", {}, alice).get("peers", [])
        return any(p.get("peerId") == peer.name and p.get("reachable") is True for p in peers)

    try:
        scenario("the hub lists the peer as reachable", reachable)
        if hub_kind == "ours":
            # A published hub runs under `cluster controller serve` (its `cluster start --local`
            # drops `peers:`), where the local platform's workers never pass their /health
            # probe: it has no workers of its own to run a CPU job on.
            scenario("a CPU job runs on the hub itself", a_cpu_job_runs_on_the_hub)
        if peer_kind == "ours":
            # A published *local* peer advertises no routing attributes (its local backend
            # descriptor has none), so only a pin reaches it.
            scenario("an unpinned GPU job is routed to the peer", a_gpu_job_is_routed_to_the_peer)
        scenario("a pinned job runs on the peer and its end is mirrored", pinned_job_runs_on_the_peer_and_is_mirrored)
        scenario("a cancel on the hub ends the job on the peer", cancel_on_the_hub_ends_it_on_the_peer)
        scenario("a submitter the peer does not admit is refused with the reason", a_submitter_the_peer_refuses_is_told_why)
        scenario("a pin to an unknown peer is refused at submit", a_pin_to_an_unknown_peer_is_refused)
        scenario("a child job pinned to the peer is refused, naming it", a_child_job_pinned_to_the_peer_is_refused_naming_it)
        if peer_kind == "ours":
            # A published local peer comes back on a new port, which no hub config can follow.
            scenario("a killed peer is seen unreachable, then back, and takes jobs again",
                     a_killed_peer_is_seen_unreachable_and_back)
    finally:
        for n in nodes:
            n.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--published", required=True)
    ap.add_argument("-k", default="")
    a = ap.parse_args()
    pairings = [("ours", "ours"), ("ours", "published"), ("published", "ours")]
    try:
        for hub_kind, peer_kind in pairings:
            if a.k and a.k not in f"{hub_kind}-{peer_kind}":
                continue
            with tempfile.TemporaryDirectory(prefix="iris-fedcompat-") as work:
                f = Fed(os.path.abspath(a.ours), os.path.abspath(a.published), work)
                try:
                    pairing(f, hub_kind, peer_kind)
                except Exception as e:
                    RESULTS.append((False, f"{hub_kind} hub, {peer_kind} peer: setup"))
                    print(f"FAIL {hub_kind} hub, {peer_kind} peer: setup: {e}", flush=True)
                    traceback.print_exc()
                    for log in sorted(Path(work).glob("*.log")):
                        print(f"---- {log.name} (tail) ----\n{log.read_text()[-1500:]}", flush=True)
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
                p.wait()
    passed = sum(1 for ok, _ in RESULTS if ok)
    failed = len(RESULTS) - passed
    print(f"federation: {passed} passed, {failed} failed")
    sys.exit(1 if failed or not RESULTS else 0)


if __name__ == "__main__":
    main()
