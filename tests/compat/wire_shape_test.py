"""Wire shape: for each RPC both controllers serve, the JSON our controller returns has the same
fields as the PUBLISHED Python controller's (marin-iris) for the same state.

    python wire_shape_test.py --ours target/debug/iris --published .venv-compat/bin/iris [--record DIR]

Starts a published local cluster and one of ours from the same published-format config, builds
the same state on both through the published CLI (a job that succeeds, one that fails, one that
runs, one no worker can host, a 2-replica job, a budget, an endpoint), then calls every RPC below
on both with Connect JSON. The published controller's answer is the golden (written to --record
when given); ours must have exactly its fields. Field paths are read against the published
descriptors: a map's keys are data, a list's elements are merged, values are ignored. A field the
published answer has and ours lacks is "missing" (a zero the reference sends on purpose, which
explicit field presence keeps); one only ours has is "extra". A difference passes only when
DELIBERATE_EXTRAS (on purpose, with the reason) or KNOWN_DIFFERENCES (not fixed yet, with the
issue) names it, and an entry that no longer occurs fails too. Prints one line per RPC and
`N passed, M failed`; exits 1 on any failure.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import httpx
from google.protobuf import descriptor as _d

from finelog.rpc import logging_pb2
from iris.rpc import controller_pb2

from harness import PROCS, fail, spawn, wait_until

SERVICE = controller_pb2.DESCRIPTOR.services_by_name["ControllerService"]
ENDPOINTS = controller_pb2.DESCRIPTOR.services_by_name["EndpointService"]
LOGS = logging_pb2.DESCRIPTOR.services_by_name["LogService"]

# Fields whose values are free-form on purpose (JSON objects of well-known types).
OPAQUE = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.Any"}

CONFIG = """name: shape
platform: {local: {}}
controller: {local: {port: 0}}
worker_provider: {}
scale_groups:
  cpu:
    num_vms: 1
    buffer_slices: 1
    max_slices: 1
    resources: {cpu: 8, ram: 16GB, disk: 20GB, device_type: cpu, device_variant: cpu, capacity_type: on-demand}
    slice_template:
      num_vms: 1
      local: {}
"""

# Fields only ours sends, on purpose (ARCHITECTURE.md, "Wire fidelity"): method -> {path: reason}.
# A path covers the fields under it. Each must still occur (a stale entry fails the test).
USAGE = ("the task's latest CPU / memory sample and its peak memory, so `job describe` shows "
         "PEAK MEM (the published controller leaves it to worker-served status calls)")
CONTAINER = ("a process worker reports the attempt's process group as its container as soon as the group "
             "exists, so a command that fails at once still names it; the published worker may not have")
DELIBERATE_EXTRAS = {
    "ListTasks": {
        "tasks[].pendingReason": "each pending task says why it waits, not only the job",
        "tasks[].resourceUsage": USAGE,
        "tasks[].containerId": CONTAINER,
    },
    "GetTaskStatus": {
        "task.pendingReason": "each pending task says why it waits, not only the job",
        "task.resourceUsage": USAGE,
        "task.containerId": CONTAINER,
        "task.canBeScheduled": "whether any worker could ever run it, beside the reason",
    },
    "GetWorkerStatus": {
        "vm": "a local worker is its own host: `cluster vm status` shows it as one VM",
        "scaleGroup": "the worker's scale group, so `cluster vm status` can name it",
    },
    "ListBackends": {
        "backends[].advertisedAttributes": "the routing attributes a hub of ours routes on",
    },
}

# Extras that appear only once a worker has sampled the task (timing-dependent), so their
# absence is not a stale entry.
SOMETIMES = {("ListTasks", "tasks[].resourceUsage"), ("GetTaskStatus", "task.resourceUsage"),
             ("ListTasks", "tasks[].containerId"), ("GetTaskStatus", "task.containerId")}

# Calls ours answers with a clear error where the published controller answers 200, on purpose
# (ARCHITECTURE.md, "Wire fidelity"): (method, label) -> reason. Each must still occur.
DELIBERATE_REFUSALS = {
    ("LaunchJob", "invalid"): "a job with no command is refused at submit, naming the field, "
                              "instead of being accepted to fail on a worker",
    ("MintEndpointToken", ""): "without auth /proxy is open to anyone who reaches it, so a capability "
                               "URL would promise a protection there is none of; the error says so",
    ("RenewWorkerToken", ""): "without auth a worker needs no token; the error says auth is off",
    ("GetKubernetesClusterStatus", ""): "a controller with no Kubernetes backend says so instead of "
                                        "an empty status",
}

# Differences not fixed yet, each with the issue that fixes it: (method, "missing" | "extra",
# path) -> reason; a path covers the fields under it. A ratchet: a difference not listed here
# fails, and so does an entry that no longer occurs (remove it).
KNOWN_DIFFERENCES = {
}


def covers(entry, path):
    return path == entry or path.startswith(entry + ".") or path.startswith(entry + "[]") or \
        path.startswith(entry + "{}")


def allowed(method, kind, path):
    """The accepted entry (method, kind, entry path) covering a difference, or None."""
    if kind == "extra":
        for entry in DELIBERATE_EXTRAS.get(method, {}):
            if covers(entry, path):
                return (method, kind, entry)
    for m, k, entry in KNOWN_DIFFERENCES:
        if (m, k) == (method, kind) and covers(entry, path):
            return (m, k, entry)
    return None


def paths(msg_desc, value, prefix=""):
    """The field paths of a JSON value read as `msg_desc`: `a.b`, `a[].c`, `m{}.d`."""
    out = set()
    if not isinstance(value, dict):
        return out
    by_json = {f.json_name: f for f in msg_desc.fields}
    by_json.update({f.name: f for f in msg_desc.fields})
    for key, v in value.items():
        f = by_json.get(key)
        p = f"{prefix}{key}"
        if f is None:
            out.add(p + " (not in the published proto)")
            continue
        out.add(p)
        if f.type != _d.FieldDescriptor.TYPE_MESSAGE or f.message_type.full_name in OPAQUE:
            continue
        if f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            if vf.type == _d.FieldDescriptor.TYPE_MESSAGE:
                for item in (v or {}).values():
                    out |= paths(vf.message_type, item, p + "{}.")
        elif f.is_repeated:
            for item in v or []:
                out |= paths(f.message_type, item, p + "[].")
        else:
            out |= paths(f.message_type, v, p + ".")
    return out


class Controller:
    def __init__(self, kind, url):
        self.kind, self.url = kind, url

    def call(self, service, method, body):
        # A published controller serves its log server only behind its endpoint proxy.
        base = f"{self.url}/proxy/system.log-server" if service is LOGS else self.url
        r = httpx.post(
            f"{base}/{service.full_name}/{method}",
            content=json.dumps(body),
            headers={"content-type": "application/json"},
            timeout=60,
        )
        try:
            data = r.json()
        except ValueError:
            data = {"_raw": r.text[:300]}
        return r.status_code, data


def start_published(published, work):
    cfg = work / "published.yaml"
    cfg.write_text(CONFIG)
    log = work / "published.log"
    p = spawn([published, "--config", str(cfg), "cluster", "start", "--local"], log, cwd=work / "ws")

    def url():
        if p.poll() is not None:
            fail(f"the published cluster exited: {log.read_text()[-2000:]}")
        m = re.search(r"Controller started at (http://127\.0\.0\.1:\d+)", log.read_text())
        return m and m.group(1)

    return Controller("published", wait_until("the published cluster to start", url, timeout=180))


def start_ours(ours, work):
    cfg = work / "ours.yaml"
    cfg.write_text(CONFIG)
    state = work / "ours-state"
    log = work / "ours.log"
    p = spawn([ours, "cluster", "start", "--local", "--config", str(cfg), "--state-dir", str(state)], log,
              cwd=work / "ws")

    def url():
        if p.poll() is not None:
            fail(f"our cluster exited: {log.read_text()[-2000:]}")
        f = state / "controller.url"
        return f.exists() and f.read_text().strip()

    return Controller("ours", wait_until("our cluster to start", url, timeout=60))


def cli(published, c, work, *args):
    r = subprocess.run([published, "--controller-url", c.url, *args], capture_output=True, text=True, timeout=180,
                       cwd=work / "ws")
    if r.returncode != 0:
        fail(f"{c.kind}: iris {' '.join(args)} exited {r.returncode}: {r.stdout[-800:]}{r.stderr[-1500:]}")
    return r.stdout + r.stderr


def job_state(c, job_id):
    _, data = c.call(SERVICE, "GetJobStatus", {"jobId": job_id})
    return ((data.get("job") or {}).get("state") or "").removeprefix("JOB_STATE_").lower()


def lists_unmet(c, job_id):
    """Whether the autoscaler's last routing decision lists a task of `job_id` as unmet."""
    _, data = c.call(SERVICE, "GetAutoscalerStatus", {})
    decision = (data.get("status") or {}).get("lastRoutingDecision") or {}
    return any(t.startswith(job_id + "/") for u in decision.get("unmetEntries") or []
               for t in (u.get("entry") or {}).get("taskIds") or [])


def build_state(published, c, work):
    """The same jobs, budget and endpoint on `c`; the job ids by role."""
    wait_until(f"{c.kind}'s worker", lambda: c.call(SERVICE, "ListWorkers", {})[1].get("workers"), timeout=180)
    jobs = {}
    for role, flags, cmd in [
        ("ok", [], ["sh", "-c", "echo shape-ok"]),
        ("fails", [], ["sh", "-c", "exit 3"]),
        ("pair", ["--replicas", "2"], ["sh", "-c", "echo pair"]),
        ("runs", [], ["sleep", "600"]),
        ("huge", ["--cpu", "8"], ["true"]),  # pending: "runs" holds a core of the 8
    ]:
        out = cli(published, c, work, "job", "run", "--no-wait", "--job-name", f"shape-{role}", *flags, "--", *cmd)
        ids = re.findall(r"/[\w.@-]+/shape-" + role, out)
        if not ids:
            fail(f"{c.kind}: no job id in the output of job run: {out[-500:]}")
        jobs[role] = ids[-1]
    for role, want in [("ok", "succeeded"), ("fails", "failed"), ("pair", "succeeded"), ("runs", "running")]:
        wait_until(f"{c.kind}: {role} to be {want}", lambda: job_state(c, jobs[role]) == want, timeout=180)
    # The state compared includes the autoscaler's verdict on "huge" (an unmet entry in its last
    # routing decision); the autoscaler evaluates on its own clock, so wait for it to have seen
    # the job rather than race it (a loaded machine once compared before it had).
    wait_until(f"{c.kind}: the autoscaler to count huge as unmet", lambda: lists_unmet(c, jobs["huge"]), timeout=60)
    user = jobs["ok"].split("/")[1]
    status, data = c.call(SERVICE, "SetUserBudget", {"userId": user, "budgetLimit": "1000", "maxBand": "PRIORITY_BAND_INTERACTIVE"})
    if status != 200:
        fail(f"{c.kind}: SetUserBudget: HTTP {status} {data}")
    status, data = c.call(ENDPOINTS, "RegisterEndpoint", {"name": f"{jobs['runs']}/shape-ep", "address": "127.0.0.1:1",
                                                          "taskId": f"{jobs['runs']}/0"})
    if status != 200:
        fail(f"{c.kind}: RegisterEndpoint: HTTP {status} {data}")
    return jobs, user


def requests(jobs, user, worker_id):
    """(service, method, label, body) for every RPC compared; bodies use the state's names."""
    r = [
        (SERVICE, "ListJobs", "", {}),
        (SERVICE, "GetJobState", "", {"jobIds": list(jobs.values())}),
        (SERVICE, "ListWorkers", "", {}),
        (SERVICE, "GetWorkerStatus", "", {"id": worker_id}),
        (SERVICE, "ListUsers", "", {}),
        (SERVICE, "GetCurrentUser", "", {}),
        (SERVICE, "GetUserBudget", "", {"userId": user}),
        (SERVICE, "ListUserBudgets", "", {}),
        (SERVICE, "GetSchedulerState", "", {}),
        (SERVICE, "ListBackends", "", {}),
        (SERVICE, "ListPeers", "", {}),
        (SERVICE, "GetProcessStatus", "", {}),
        (SERVICE, "GetAutoscalerStatus", "", {}),
        (SERVICE, "ExecuteRawQuery", "", {"sql": "SELECT 1 AS one"}),
        (SERVICE, "KickTasks", "", {"targets": [f"{jobs['huge']}/0"], "reason": "shape"}),
        (ENDPOINTS, "ListEndpoints", "", {"prefix": jobs["runs"]}),
    ]
    for role, job in jobs.items():
        r.append((SERVICE, "GetJobStatus", role, {"jobId": job}))
        r.append((SERVICE, "ListTasks", role, {"jobId": job}))
        r.append((SERVICE, "GetTaskStatus", role, {"taskId": f"{job}/0"}))
    r.append((LOGS, "FetchLogs", "job prefix", {"source": f"{jobs['ok']}/", "matchScope": "MATCH_SCOPE_PREFIX",
                                                "maxLines": 100}))
    r.append((LOGS, "FetchLogs", "one attempt", {"source": f"{jobs['ok']}/0:0", "matchScope": "MATCH_SCOPE_EXACT"}))
    r.append((LOGS, "FetchLogs", "tail", {"source": f"{jobs['pair']}/", "matchScope": "MATCH_SCOPE_PREFIX",
                                          "maxLines": 1, "tail": True}))
    return r


def mutations(jobs, user):
    """The writing RPCs, compared after the reads, in order: (service, method, label, body) where
    a callable body is given the answers so far by method (an endpoint id, a job id)."""
    running = f"{jobs['runs']}/0"
    return [
        (SERVICE, "LaunchJob", "", {
            "name": f"/{user}/shape-direct",
            "entrypoint": {"runCommand": {"argv": ["sh", "-c", "echo direct"]}},
            "resources": {"cpuMillicores": 100, "memoryBytes": str(64 << 20)},
            "environment": {},
            "replicas": 1,
        }),
        (SERVICE, "LaunchJob", "invalid", {"name": f"/{user}/shape-bad", "resources": {"cpuMillicores": 100}}),
        (SERVICE, "SetUserBudget", "", {"userId": user, "budgetLimit": "2000", "maxBand": "PRIORITY_BAND_BATCH"}),
        (ENDPOINTS, "RegisterEndpoint", "", {"name": f"{jobs['runs']}/shape-ep2", "address": "127.0.0.1:2",
                                             "taskId": running}),
        (SERVICE, "MintEndpointToken", "", {"endpointName": f"{jobs['runs']}/shape-ep2"}),
        (ENDPOINTS, "UnregisterEndpoint", "",
         lambda answers: {"endpointId": answers["RegisterEndpoint"]["endpointId"]}),
        (SERVICE, "ExecInContainer", "", {"taskId": running, "command": ["sh", "-c", "echo exec"],
                                          "timeoutSeconds": 20}),
        (SERVICE, "ExecInContainer", "unknown task", {"taskId": f"/{user}/no-such-job/0", "command": ["true"]}),
        (SERVICE, "ProfileTask", "threads", {"target": running, "durationSeconds": 1,
                                             "profileType": {"threads": {}}}),
        (SERVICE, "ProfileTask", "unknown task", {"target": f"/{user}/no-such-job/0", "durationSeconds": 1,
                                                  "profileType": {"threads": {}}}),
        (LOGS, "PushLogs", "", {"key": f"{jobs['runs']}/0:0", "entries": [
            {"source": "stdout", "data": "pushed by the wire-shape test", "timestamp": {"epochMs": "1"}}]}),
        (SERVICE, "BeginCheckpoint", "", {}),
        (SERVICE, "GetKubernetesClusterStatus", "", {}),
        (SERVICE, "FederationSync", "", {"requesterId": "shape-hub"}),
        (SERVICE, "CompleteJob", "unknown job", {"jobId": f"/{user}/no-such-job"}),
        (SERVICE, "CompleteJob", "", {"jobId": jobs["runs"]}),
        (SERVICE, "TerminateJob", "", {"jobId": jobs["huge"]}),
        (SERVICE, "TerminateJob", "unknown job", {"jobId": f"/{user}/no-such-job"}),
        (SERVICE, "RenewWorkerToken", "", {}),
        (SERVICE, "Register", "", {"address": "127.0.0.1:1", "workerId": "shape-extra", "metadata": {
            "hostname": "shape-extra", "ipAddress": "127.0.0.1", "cpuCount": 2, "memoryBytes": str(4 << 30),
            "diskBytes": str(10 << 30), "device": {"cpu": {"variant": "cpu"}}}}),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--published", required=True)
    ap.add_argument("--record", default="", help="write the published answers here, one file per RPC")
    ap.add_argument("-k", default="")
    a = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="iris-wireshape-") as work:
        work = Path(work)
        (work / "ws").mkdir()
        (work / "ws" / "README").write_text("wire shape workspace\n")
        try:
            pub = start_published(os.path.abspath(a.published), work)
            ours = start_ours(os.path.abspath(a.ours), work)
            state = {c.kind: build_state(os.path.abspath(a.published), c, work) for c in (pub, ours)}
            workers = {c.kind: c.call(SERVICE, "ListWorkers", {})[1]["workers"][0]["workerId"] for c in (pub, ours)}
            plan = {c.kind: requests(*state[c.kind], workers[c.kind]) for c in (pub, ours)}
            seen = set()

            def compare(svc, method, label, pbody, obody):
                """Call `method` on both; print and record the verdict; the answers by kind."""
                name = f"{method}{f' ({label})' if label else ''}"
                out_desc = svc.methods_by_name[method].output_type
                ps, pdata = pub.call(svc, method, pbody)
                os_, odata = ours.call(svc, method, obody)
                if a.record:
                    rec = Path(a.record)
                    rec.mkdir(parents=True, exist_ok=True)
                    fname = re.sub(r"[^\w]+", "_", name).strip("_") + ".json"
                    (rec / fname).write_text(json.dumps({"request": pbody, "status": ps, "response": pdata},
                                                        indent=2, sort_keys=True) + "\n")
                problems = []
                refusal = (method, label) in DELIBERATE_REFUSALS
                if refusal:
                    seen.add(("refusal", method, label))
                    if not (ps == 200 and os_ >= 400 and odata.get("message")):
                        problems.append(f"listed as a deliberate refusal, but HTTP {os_} where the published "
                                        f"controller answers {ps}: {json.dumps(odata)[:300]}")
                elif ps != os_:
                    problems.append(f"HTTP {os_} where the published controller answers {ps}: "
                                    f"{json.dumps(odata)[:300]} (published: {json.dumps(pdata)[:300]})")
                elif ps != 200:
                    if pdata.get("code") != odata.get("code"):
                        problems.append(f"error code {odata.get('code')} where the published controller "
                                        f"answers {pdata.get('code')}: {odata.get('message')}")
                    elif not odata.get("message"):
                        problems.append("an error with no message")
                else:
                    want, got = paths(out_desc, pdata), paths(out_desc, odata)
                    for kind, diff in (("missing", want - got), ("extra", got - want)):
                        bad = sorted(p for p in diff if allowed(method, kind, p) is None)
                        if bad:
                            problems.append(f"{kind} " + ", ".join(bad))
                        seen.update(allowed(method, kind, p) for p in diff)
                if not a.k or a.k in name:
                    results.append((not problems, name))
                    print(f"{'ok  ' if not problems else 'FAIL'} {name}"
                          f"{': ' + '; '.join(problems) if problems else ''}", flush=True)
                return {"published": pdata, "ours": odata}

            for (svc, method, label, pbody), (_, _, _, obody) in zip(plan["published"], plan["ours"]):
                compare(svc, method, label, pbody, obody)
            # The writing RPCs, each on the state the reads saw, in the same order on both.
            answers = {"published": {}, "ours": {}}
            writes = {c.kind: mutations(*state[c.kind]) for c in (pub, ours)}
            for (svc, method, label, pbody), (_, _, _, obody) in zip(writes["published"], writes["ours"]):
                if callable(pbody):
                    pbody, obody = pbody(answers["published"]), obody(answers["ours"])
                got = compare(svc, method, label, pbody, obody)
                for kind in answers:
                    answers[kind].setdefault(method, got[kind])
            if not a.k:
                # The ratchet's other half: an accepted difference that no longer occurs.
                listed = set(KNOWN_DIFFERENCES) | {
                    (m, "extra", p) for m, fields in DELIBERATE_EXTRAS.items() for p in fields
                    if (m, p) not in SOMETIMES
                } | {("refusal", m, label) for m, label in DELIBERATE_REFUSALS}
                for m, kind, p in sorted(listed - seen):
                    results.append((False, f"stale {m} {kind} {p}"))
                    what = (f"{kind} ({p}) is no longer refused" if m == "refusal"
                            else f"{m} no longer has {kind} field {p}")
                    print(f"FAIL stale entry: {what}; remove it from the list", flush=True)
        except Exception as e:
            results.append((False, f"setup: {e}"))
            print(f"FAIL setup: {e}", flush=True)
            traceback.print_exc()
            for log in sorted(work.glob("*.log")):
                print(f"---- {log.name} (tail) ----\n{log.read_text()[-2000:]}", flush=True)
        finally:
            for p in PROCS:
                if p.poll() is None:
                    os.killpg(p.pid, 15)
            for p in PROCS:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
                    p.wait()
    passed = sum(1 for ok, _ in results if ok)
    failed = len(results) - passed
    print(f"wire shape: {passed} passed, {failed} failed")
    sys.exit(1 if failed or not results else 0)


if __name__ == "__main__":
    main()
