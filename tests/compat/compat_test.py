"""Drives our controller with the published Python Iris CLI and IrisClient.

Run by tests/compat/run.sh with the venv's python:

    python compat_test.py --controller-url URL --iris PATH/TO/iris

Each step runs the published `iris` CLI (or the published `IrisClient` API) against the
controller and asserts on exit codes and output. Prints one line per step and ends with
`N passed, M failed`; exits 1 if any step failed.
"""

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ARGS = None
WORKSPACE = None  # a directory with data.txt; every CLI call runs from here
RUN_ID = f"{os.getpid()}-{int(time.time()) % 100000}"
USER = "compat"
STEPS = []

# A command that never returns by itself; jobs running it are cancelled, completed or kicked.
SLEEP = ["sleep", "600"]


def step(fn):
    STEPS.append(fn)
    return fn


class Result:
    def __init__(self, args, proc):
        self.args = args
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def describe(self):
        return f"`iris {' '.join(self.args)}` exited {self.rc}\n--- stdout\n{self.out}--- stderr\n{self.err[-3000:]}"


# Every leaf of the published CLI that a step ran (with real arguments), noted by the
# `subprocess.run` wrapper `main` installs; `every_published_leaf_ran_or_is_listed` checks it.
RAN_LEAVES = set()
# The published root's options that take a value (they may precede the command words).
VALUED_GLOBALS = {"--controller-url", "--config", "--cluster"}


def leaf_of(words):
    """The published leaf command `words` (the argv after the binary) invokes, or None."""
    leaves = _leaves()
    path = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        if w.startswith("-"):
            if path:
                break
            skip = w in VALUED_GLOBALS
            continue
        path.append(w)
        joined = " ".join(path)
        if joined in leaves:
            return joined
        if not any(leaf.startswith(joined + " ") for leaf in leaves):
            return None
    return None


_LEAVES = None


def _leaves():
    global _LEAVES
    if _LEAVES is None:
        _LEAVES = published_leaves()
    return _LEAVES


def install_leaf_ledger():
    real_run = subprocess.run

    def run(argv, *a, **kw):
        if isinstance(argv, (list, tuple)) and argv and str(argv[0]) == ARGS.iris:
            leaf = leaf_of([str(x) for x in argv[1:]])
            if leaf:
                RAN_LEAVES.add(leaf)
        return real_run(argv, *a, **kw)

    subprocess.run = run


def iris(*args, timeout=120, stdin=None, cwd=None):
    """Runs the published CLI against our controller from the workspace directory."""
    argv = [ARGS.iris, "--controller-url", ARGS.controller_url, *args]
    env = dict(os.environ, IRIS_USER=USER)
    proc = subprocess.run(
        argv,
        cwd=cwd or WORKSPACE,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(list(args), proc)


def ok(r):
    assert r.rc == 0, r.describe()
    return r


def name(tag):
    return f"compat-{RUN_ID}-{tag}"


def job_id(tag):
    return f"/{USER}/{name(tag)}"


def submit(tag, cmd, *flags):
    """`job run --no-wait`; returns the job id the CLI printed."""
    r = ok(iris("job", "run", "--no-wait", "--job-name", name(tag), *flags, "--", *cmd))
    lines = r.out.strip().splitlines()
    assert lines == [job_id(tag)], f"stdout must be only the job id:\n{r.describe()}"
    return lines[0]


def wait_until(what, fn, timeout=60.0, interval=0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


_CLIENT = None


def quiet_client_logs():
    """The in-process client logs at INFO (e.g. the log-server endpoint it resolved); keep the
    step lines readable."""
    import logging

    for name in [*logging.root.manager.loggerDict, "finelog", "iris"]:
        if name.split(".")[0] in ("finelog", "iris"):
            logging.getLogger(name).setLevel(logging.WARNING)


def client():
    """The published IrisClient; used to poll for preconditions (the CLI takes seconds to start)."""
    global _CLIENT
    if _CLIENT is None:
        from iris.client import IrisClient

        quiet_client_logs()
        _CLIENT = IrisClient.remote(ARGS.controller_url, workspace=Path(WORKSPACE))
    return _CLIENT


def api_job_state(job):
    from iris.cluster.types import JobName

    return client().job_state(JobName.from_wire(job)).value


def api_task_state(task):
    from iris.cluster.types import JobName

    return client().task_status(JobName.from_wire(task)).state.value


def describe_state(job):
    r = ok(iris("job", "describe", job))
    m = re.search(r"^State: (\S+)", r.out, re.M)
    assert m, r.describe()
    return m.group(1), r


def task_rows(describe_out):
    """Task table rows of `job describe`: {index: state}."""
    rows = {}
    for line in describe_out.splitlines():
        m = re.match(r"^\s*(\d+)\s+([a-z_]+)\s", line)
        if m:
            rows[int(m.group(1))] = m.group(2)
    return rows


def task_state(task):
    r = ok(iris("task", "describe", task))
    m = re.search(r"^State: (\S+)", r.out, re.M)
    assert m, r.describe()
    return m.group(1), r


# --------------------------------------------------------------------------------------------
# Steps


@step
def job_run_no_wait():
    j = submit("nowait", ["true"])
    assert j == job_id("nowait")


@step
def job_run_streams_output_and_exits_0():
    r = iris("job", "run", "--job-name", name("stream"), "--", "sh", "-c", "echo compat-out-line; echo compat-err-line >&2")
    ok(r)
    assert r.out.strip().splitlines()[0] == job_id("stream"), r.describe()
    assert "compat-out-line" in r.err and "compat-err-line" in r.err, r.describe()
    assert "Job completed with state: succeeded" in r.err, r.describe()


@step
def job_run_failing_command_exits_1():
    r = iris("job", "run", "--job-name", name("exit3"), "--", "sh", "-c", "echo compat-before-exit; exit 3")
    assert r.rc == 1, r.describe()
    assert "compat-before-exit" in r.err, r.describe()
    assert "Exit code: 3" in r.err, r.describe()


@step
def job_run_ships_workspace_bundle():
    r = ok(iris("job", "run", "--job-name", name("bundle"), "--", "cat", "data.txt"))
    assert "compat-data-file-contents" in r.err, r.describe()


@step
def job_run_ships_a_bundle_over_two_mib():
    with tempfile.TemporaryDirectory(prefix="iris-compat-big-") as ws:
        # Incompressible, so the zipped bundle stays ~5 MiB (the client allows 25 MiB).
        Path(ws, "big.bin").write_bytes(os.urandom(5 << 20))
        r = ok(iris("job", "run", "--job-name", name("bigbundle"), "--", "wc", "-c", "big.bin", cwd=ws))
        assert f"{5 << 20} big.bin" in r.err, r.describe()


@step
def job_run_enable_extra_resources():
    # --memory >= 4GB needs --enable-extra-resources; without it the CLI refuses before any RPC.
    r = iris("job", "run", "--no-wait", "--memory", "8GB", "--job-name", name("big"), "--", "true")
    assert r.rc == 2 and "--enable-extra-resources" in r.err, r.describe()
    j = submit("big", ["true"], "--enable-extra-resources", "--memory", "8GB")
    ok(iris("job", "wait", j))


@step
def job_list():
    r = ok(iris("job", "list"))
    assert r.out.splitlines()[0].split()[:4] == ["JOB", "ID", "STATE", "SUBMITTED"], r.describe()
    rows = {line.split()[0]: line.split()[1] for line in r.out.splitlines()[1:] if line.startswith("/")}
    assert rows.get(job_id("stream")) == "succeeded", r.describe()
    assert rows.get(job_id("exit3")) == "failed", r.describe()
    # Newest first.
    ids = [line.split()[0] for line in r.out.splitlines()[1:] if line.startswith("/")]
    assert ids.index(job_id("exit3")) < ids.index(job_id("stream")), r.describe()
    # The failed job shows its reason (the CLI cuts it at 63 characters).
    failed_row = next(line for line in r.out.splitlines() if line.startswith(job_id("exit3") + " "))
    assert "REASON" in r.out.splitlines()[0] and len(failed_row.split()) > 4, r.describe()


@step
def job_list_state_running():
    j = submit("running", SLEEP)
    wait_until(f"{j} running", lambda: api_job_state(j) == "running")
    r = ok(iris("job", "list", "--state", "running"))
    ids = [line.split()[0] for line in r.out.splitlines() if line.startswith("/")]
    assert j in ids, r.describe()
    assert job_id("stream") not in ids, r.describe()
    assert all(line.split()[1] == "running" for line in r.out.splitlines() if line.startswith("/")), r.describe()
    r = ok(iris("job", "list", "--prefix", f"/{USER}/compat-{RUN_ID}-run"))
    assert [line.split()[0] for line in r.out.splitlines() if line.startswith("/")] == [j], r.describe()
    ok(iris("job", "cancel", j))


@step
def job_describe():
    r = ok(iris("job", "describe", job_id("stream")))
    assert f"Job: {job_id('stream')}" in r.out, r.describe()
    assert re.search(r"^State: succeeded\s+exit=0\s+failures=0\s+preemptions=0", r.out, re.M), r.describe()
    assert "Tasks: 1/1 completed  succeeded=1" in r.out, r.describe()
    assert task_rows(r.out) == {0: "succeeded"}, r.describe()
    r = ok(iris("job", "describe", job_id("exit3")))
    assert re.search(r"^State: failed\s+exit=3", r.out, re.M) or re.search(r"^State: failed", r.out, re.M), r.describe()
    assert "failures=1" in r.out and "Error:" in r.out, r.describe()
    assert task_rows(r.out) == {0: "failed"}, r.describe()


@step
def job_describe_unknown_job_is_not_found():
    t0 = time.monotonic()
    r = iris("job", "describe", f"/{USER}/compat-{RUN_ID}-no-such-job", timeout=60)
    assert r.rc != 0, r.describe()
    assert "not found" in r.err.lower(), r.describe()
    assert time.monotonic() - t0 < 30, "NOT_FOUND must not be retried"


@step
def job_logs_tail_and_no_tail():
    j = job_id("lines")
    ok(iris("job", "run", "--job-name", name("lines"), "--", "sh", "-c", "for i in 1 2 3 4 5; do echo compat-line-$i; done"))
    r = ok(iris("job", "logs", j))
    lines = [line for line in r.out.splitlines() if "compat-line-" in line]
    assert [line.rsplit(" ", 1)[-1] for line in lines] == [f"compat-line-{i}" for i in range(1, 6)], r.describe()
    assert re.match(rf"^\[\d\d:\d\d:\d\d\] task={re.escape(j)}/0 attempt=0 \| compat-line-1$", lines[0]), r.describe()
    r = ok(iris("job", "logs", j, "--no-tail", "--max-lines", "2"))
    got = [line.rsplit(" ", 1)[-1] for line in r.out.splitlines() if "compat-line-" in line]
    assert got == ["compat-line-1", "compat-line-2"], r.describe()
    r = ok(iris("job", "logs", j, "--max-lines", "2"))
    got = [line.rsplit(" ", 1)[-1] for line in r.out.splitlines() if "compat-line-" in line]
    assert got == ["compat-line-4", "compat-line-5"], r.describe()
    r = ok(iris("job", "logs", j, "--substring", "line-3"))
    got = [line.rsplit(" ", 1)[-1] for line in r.out.splitlines() if "compat-line-" in line]
    assert got == ["compat-line-3"], r.describe()
    r = ok(iris("task", "logs", f"{j}/0", "--no-tail", "--max-lines", "1"))
    assert r.out.strip().endswith("compat-line-1"), r.describe()


@step
def job_logs_follow():
    j = submit("follow", ["sh", "-c", "echo compat-follow-a; sleep 1; echo compat-follow-b"])
    r = ok(iris("job", "logs", "-f", j, timeout=60))
    got = [line.rsplit(" ", 1)[-1] for line in r.out.splitlines() if "compat-follow-" in line]
    assert got == ["compat-follow-a", "compat-follow-b"], r.describe()


@step
def job_wait():
    j = submit("wait-ok", ["sh", "-c", "sleep 1"])
    r = ok(iris("job", "wait", j))
    assert r.out.strip() == "succeeded", r.describe()
    r = iris("job", "wait", job_id("exit3"))
    assert r.rc == 1 and r.out.strip() == "failed", r.describe()


@step
def job_cancel_two_replicas():
    j = submit("cancel", SLEEP, "--replicas", "2")
    wait_until(f"{j} running", lambda: api_job_state(j) == "running")
    r = ok(iris("job", "cancel", j))
    assert r.out.splitlines() == ["Cancelled jobs:", f"  {j}"], r.describe()

    def both_killed():
        from iris.cluster.types import JobName

        tasks = client().list_tasks(JobName.from_wire(j))
        return api_job_state(j) == "killed" and [t.state.value for t in tasks] == ["killed", "killed"]

    wait_until(f"{j} and both tasks killed", both_killed, timeout=30)
    state, d = describe_state(j)
    assert state == "killed" and task_rows(d.out) == {0: "killed", 1: "killed"}, d.describe()
    assert "Tasks: 2/2 completed  killed=2" in d.out, d.describe()
    r = iris("job", "cancel", f"{j}-nope")
    assert r.rc == 1 and "No job named" in r.err and j in r.err, r.describe()


@step
def job_complete():
    j = submit("complete", SLEEP)
    wait_until(f"{j} running", lambda: api_job_state(j) == "running")
    r = ok(iris("job", "complete", j))
    assert r.out.strip() == f"Completed job: {j}", r.describe()
    r = ok(iris("job", "wait", j, timeout=60))
    assert r.out.strip() == "succeeded", r.describe()
    state, d = describe_state(j)
    assert state == "succeeded" and task_rows(d.out) == {0: "succeeded"}, d.describe()


@step
def task_describe():
    t = f"{job_id('exit3')}/0"
    state, r = task_state(t)
    assert state == "failed", r.describe()
    assert f"Task: {t}" in r.out and "exit=3" in r.out, r.describe()
    assert "Resources: " in r.out and "Attempts:" in r.out, r.describe()
    # REASON falls back to the attempt's error when the backend reports no terminal reason.
    assert re.search(r"^\s*0\s+[0-9a-f]{12}\s+failed\s+3\s+\S+\s+Exit code: 3$", r.out, re.M), r.describe()
    # Root cause: distilled from the failed task's last log lines.
    assert re.search(r"^Root cause:\n  compat-before-exit$", r.out, re.M), r.describe()
    r = iris("task", "describe", f"{job_id('exit3')}/7")
    assert r.rc != 0 and "not found" in r.err.lower(), r.describe()


def event_actions(out):
    """The ACTION column of `task events` / `attempt events` rows, in order."""
    return [
        line.split()[4]
        for line in out.splitlines()
        if re.match(r"^\d{4}-\d\d-\d\dT", line) and len(line.split()) >= 5
    ]


@step
def task_events_and_attempt_events_show_each_transition():
    # The published CLI reads these from finelog's StatsService (`iris.task_event`) through
    # /proxy/system.log-server, which the controller fills from its own task events.
    t = f"{job_id('exit3')}/0"
    # The published CLI orders by `ts` alone, so events in the same millisecond may show in
    # either order: compared as a set, and the times must not go backwards. A command that
    # exits at once may end before the worker saw it running (building -> failed).
    def complete(actions):
        return {"TaskAssigned", "TaskBuilding", "TaskFailed"} <= set(actions) <= {
            "TaskAssigned", "TaskBuilding", "TaskRunning", "TaskFailed"} and len(actions) == len(set(actions))
    deadline = time.time() + 30
    while True:
        r = iris("task", "events", t)
        if (r.rc == 0 and complete(event_actions(r.out))) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert r.rc == 0 and complete(event_actions(r.out)), r.describe()
    want = sorted(event_actions(r.out))
    times = re.findall(r"^(\d{4}-\d\d-\d\dT\S+)", r.out, re.M)
    assert times == sorted(times), r.describe()
    assert f"Task: {t}" in r.out and "Exit code: 3" in r.out, r.describe()
    assert re.search(r"\s0\s+Warning\s+iris/worker\s+TaskFailed\s+1\s", r.out), r.describe()
    r = ok(iris("attempt", "events", f"{t}:0"))
    assert sorted(event_actions(r.out)) == want, r.describe()
    r = iris("attempt", "events", f"{t}:5")
    assert r.rc != 0 and "Attempt 5 not found" in r.err, r.describe()


@step
def stats_tables_round_trip_through_the_published_log_client():
    import datetime
    from dataclasses import dataclass

    from finelog.client import LogClient

    quiet_client_logs()

    @dataclass
    class Metric:
        key_column = "run"
        run: str
        step: int
        ts: datetime.datetime
        loss: float
        ok: bool
        tags: dict[str, str]
        hist: list[float]
        blob: bytes
        note: str | None = None

    ns = f"compat.metrics-{RUN_ID}".replace("-", "_")
    c = LogClient.connect(ARGS.controller_url + "/proxy/system.log-server")
    table = c.get_table(ns, Metric)
    at = datetime.datetime(2026, 12, 3, 12, 0, 0, 123000)
    rows = [
        Metric("r1", i, at, 0.5 / (i + 1), i % 2 == 0, {"i": str(i)}, [1.0, float(i)], b"\x00\x01", "first" if i == 0 else None)
        for i in range(5)
    ]
    table.write(rows)
    assert str(table.flush(timeout=20)).lower().endswith("succeeded"), "flush"
    got = c.query(f'SELECT run, step, ts, loss, ok, tags, hist, blob, note FROM "{ns}" WHERE run = \'r1\' ORDER BY step')
    assert got.num_rows == 5, got
    first = got.to_pylist()[0]
    assert first == {
        "run": "r1", "step": 0, "ts": at, "loss": 0.5, "ok": True, "tags": [("i", "0")],
        "hist": [1.0, 0.0], "blob": b"\x00\x01", "note": "first",
    }, first
    assert c.query(f'SELECT count(*) AS n, max(loss) AS m FROM "{ns}"').to_pylist() == [{"n": 5, "m": 0.5}]
    listed = {n.namespace: n for n in c.list_namespaces()}
    # Ours, and the controller's own: task events, task and host samples, task-state rollups.
    iris_ns = {"iris.task_event", "iris.worker", "iris.task_state"}
    assert {"log", ns} | iris_ns <= set(listed), sorted(listed)
    assert all(listed[n].row_count > 0 for n in iris_ns), {n: listed[n].row_count for n in iris_ns}
    assert listed[ns].row_count == 5 and listed[ns].max_seq - listed[ns].min_seq == 4, listed[ns]
    names = [col.name for col in c.get_table_schema(ns).columns]
    assert names[:2] == ["run", "step"] and names[-1] == "cluster", names
    # The log store is the privileged `log` namespace.
    lines = c.query(f"SELECT data FROM \"log\" WHERE key = '{job_id('exit3')}/0:0'").to_pylist()
    assert {"data": "compat-before-exit"} in lines, lines
    for sql, needle in [
        (f'DELETE FROM "{ns}"', "only a read"),
        ("SELECT * FROM no_such_table", "no such table"),
    ]:
        try:
            c.query(sql)
        except Exception as e:  # finelog's SchemaValidationError
            assert needle in str(e), (sql, e)
        else:
            raise AssertionError(f"{sql} was accepted")
    c.drop_table(ns)
    assert ns not in {n.namespace for n in c.list_namespaces()}


@step
def job_describe_shows_peak_memory():
    # Workers sample each running task's process group; the controller shows the newest sample
    # and the peak on the task (the published controller leaves PEAK MEM empty).
    hold = "import time; b = bytearray(150 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); time.sleep(6)"
    j = submit("peakmem", ["python3", "-c", hold])
    wait_until(f"{j} succeeded", lambda: api_job_state(j) == "succeeded", timeout=60)
    r = ok(iris("job", "describe", j))
    row = next((line for line in r.out.splitlines() if re.match(r"^\s*0\s+succeeded", line)), "")
    m = re.search(r"(\d+) MB\s+(\d+) MB", row)
    assert m and int(m.group(1)) >= 150, r.describe()
    # The samples behind it are in iris.task.
    from finelog.client import LogClient

    c = LogClient.connect(ARGS.controller_url + "/proxy/system.log-server")
    peak = c.query(f"SELECT max(memory_peak_mb) AS m FROM \"iris.task\" WHERE task_id = '{j}/0'").to_pylist()
    assert peak[0]["m"] >= 150, peak


@step
def task_preempt_running_task():
    j = submit("preempt", SLEEP)
    t = f"{j}/0"
    wait_until(f"{t} running", lambda: api_task_state(t) == "running")
    r = ok(iris("task", "preempt", t, "--reason", "compat test"))
    assert r.out.strip() == f"preempted: {t}", r.describe()

    # The preemption retry budget (1000) lets it run again as attempt 1.
    def rerunning():
        from iris.cluster.types import JobName

        st = client().task_status(JobName.from_wire(t))
        return st.state.value == "running" and st.current_attempt_number == 1

    wait_until(f"{t} running again as attempt 1", rerunning, timeout=30)
    state, d = task_state(t)
    assert state == "running" and re.search(r"^\s*1\s+[0-9a-f]{12}\s+running", d.out, re.M), d.describe()
    assert re.search(r"^\s*0\s+[0-9a-f]{12}\s+preempted\s", d.out, re.M), d.describe()
    state, d = describe_state(j)
    assert "preemptions=1" in d.out, d.describe()
    ok(iris("job", "cancel", j))


@step
def task_fail_running_task():
    j = submit("fail", SLEEP)
    t = f"{j}/0"
    wait_until(f"{t} running", lambda: api_task_state(t) == "running")
    r = ok(iris("task", "fail", t))
    assert r.out.strip() == f"failed: {t}", r.describe()
    r = iris("job", "wait", j, timeout=60)
    assert r.rc == 1 and r.out.strip() == "failed", r.describe()
    state, d = task_state(t)
    assert state == "failed", d.describe()
    # A finished task cannot be kicked again: rejected, exit 1.
    r = iris("task", "fail", t)
    assert r.rc == 1 and f"rejected: {t}" in r.err, r.describe()


@step
def query_csv():
    r = ok(iris("query", "SELECT state, count(*) FROM jobs GROUP BY state", "-f", "csv"))
    lines = r.out.strip().splitlines()
    assert lines[0] == "state,count(*)", r.describe()
    counts = {int(a): int(b) for a, b in (line.split(",") for line in lines[1:])}
    # JOB_STATE_SUCCEEDED=4, FAILED=5, KILLED=6: earlier steps left jobs in each.
    assert counts.get(4, 0) >= 1 and counts.get(5, 0) >= 1 and counts.get(6, 0) >= 1, r.describe()
    total = ok(iris("query", "SELECT count(*) AS n FROM jobs", "-f", "csv")).out.strip().splitlines()
    assert total[0] == "n" and int(total[1]) == sum(counts.values()), total


@step
def query_delete_refused():
    before = ok(iris("query", "SELECT count(*) FROM jobs", "-f", "csv")).out
    r = iris("query", "DELETE FROM jobs")
    assert r.rc != 0, r.describe()
    assert "SELECT" in r.err, r.describe()
    after = ok(iris("query", "SELECT count(*) FROM jobs", "-f", "csv")).out
    assert before == after and before.strip().splitlines()[1] != "0", (before, after)


@step
def user_budget_set_get():
    u = f"budget-{RUN_ID}".replace("-", "")
    r = ok(iris("user", "budget", "set", u, "--limit", "500", "--max-band", "batch"))
    assert r.out.strip() == f"Budget set for {u}: limit=500, max_band=batch", r.describe()
    r = ok(iris("user", "budget", "get", u))
    fields = dict(line.split(":", 1) for line in r.out.strip().splitlines())
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    assert fields == {"User": u, "Limit": "500", "Spent": "0", "Max band": "batch"}, r.describe()
    r = ok(iris("user", "budget", "list"))
    assert any(line.split()[:4] == [u, "500", "0", "batch"] for line in r.out.splitlines()), r.describe()
    # A user capped at batch may not submit interactive work.
    r = iris("job", "run", "--no-wait", "--user", u, "--job-name", name("band"), "--", "true")
    assert r.rc != 0 and "maximum band" in r.err, r.describe()
    ok(iris("job", "run", "--no-wait", "--user", u, "--priority", "batch", "--job-name", name("band"), "--", "true"))


@step
def rpc_list_users_and_scheduler_state():
    import json

    j = submit("sched", SLEEP)
    wait_until(f"{j} running", lambda: api_job_state(j) == "running")
    r = ok(iris("rpc", "controller", "list-users"))
    users = {u["user"]: u for u in json.loads(r.out)["users"]}
    assert users[USER]["job_state_counts"]["running"] >= 1, r.describe()
    assert users[USER]["task_state_counts"]["running"] >= 1, r.describe()
    r = ok(iris("rpc", "controller", "get-scheduler-state"))
    state = json.loads(r.out)
    mine = [b for b in state.get("running_buckets", []) if b["job_id"] == j]
    assert len(mine) == 1 and mine[0]["count"] == 1 and mine[0]["user_id"] == USER, r.describe()
    assert state["total_running"] >= 1, r.describe()
    ok(iris("job", "cancel", j))


@step
def python_client_submit_replicas_env_logs():
    from iris.client import IrisClient, JobState
    from iris.cluster.types import Entrypoint, EnvironmentSpec, ResourceSpec

    quiet_client_logs()
    with IrisClient.remote(ARGS.controller_url, workspace=Path(WORKSPACE)) as client:
        job = client.submit(
            Entrypoint.from_command("sh", "-c", 'echo "compat-env=$COMPAT_VAR task=$IRIS_TASK_ID"'),
            name("py"),
            ResourceSpec(cpu=0.1, memory="128MB", disk="100MB"),
            environment=EnvironmentSpec(env_vars={"COMPAT_VAR": "from-python"}),
            replicas=3,
            user=USER,
        )
        assert str(job.job_id) == job_id("py"), job.job_id
        status = job.wait(timeout=120, poll_interval=1.0)
        assert status.state is JobState.SUCCEEDED, status
        assert status.task_count == 3 and status.completed_count == 3, status
        assert status.submitted_at is not None and status.started_at is not None and status.finished_at is not None
        tasks = job.tasks()
        assert [t.task_index for t in tasks] == [0, 1, 2], tasks
        entries = job.logs()
        got = sorted((str(e.task_id), e.data.split(" ")[0]) for e in entries if e.data.startswith("compat-env="))
        want = sorted((f"{job_id('py')}/{i}", "compat-env=from-python") for i in range(3))
        assert got == want, entries
        task_logs = tasks[1].logs()
        assert [e.data.split(" ")[0] for e in task_logs if e.data.startswith("compat-env")] == ["compat-env=from-python"]
        listed = [j.job_id for j in client.list_jobs(prefix=job_id("py"))]
        assert [str(x) for x in listed] == [job_id("py")], listed


def _callable_reports(word, times):
    """Runs inside the task (pickled by value): prints its arguments' product and its index."""
    from iris.cluster.client.job_info import get_job_info

    info = get_job_info()
    print(f"callable-result={word * times} index={info.task_index} of={info.num_tasks}", flush=True)


def _callable_raises():
    raise ValueError("compat-callable-boom")


@step
def python_client_callable_runs_with_args_and_sees_its_task_index():
    """The published client's main submission path: `Entrypoint.from_callable`, which runs
    `exec $IRIS_PYTHON -u $IRIS_WORKDIR/_callable_runner.py` on the worker."""
    from iris.client import IrisClient, JobState
    from iris.cluster.types import Entrypoint, ResourceSpec

    quiet_client_logs()
    with IrisClient.remote(ARGS.controller_url, workspace=Path(WORKSPACE)) as client:
        job = client.submit(
            Entrypoint.from_callable(_callable_reports, "ab", times=3),
            name("callable"),
            ResourceSpec(cpu=0.1, memory="256MB", disk="100MB"),
            replicas=3,
            user=USER,
        )
        status = job.wait(timeout=120, poll_interval=1.0, raise_on_failure=False)
        lines = [e.data for e in job.logs()]
        assert status.state is JobState.SUCCEEDED, (status, lines[-20:])
        got = sorted(l for l in lines if l.startswith("callable-result="))
        want = [f"callable-result=ababab index={i} of=3" for i in range(3)]
        assert got == want, lines


@step
def python_client_callable_that_raises_fails_with_the_exception():
    from iris.client import IrisClient, JobState
    from iris.cluster.types import Entrypoint, ResourceSpec

    quiet_client_logs()
    with IrisClient.remote(ARGS.controller_url, workspace=Path(WORKSPACE)) as client:
        job = client.submit(
            Entrypoint.from_callable(_callable_raises),
            name("callable-raises"),
            ResourceSpec(cpu=0.1, memory="256MB", disk="100MB"),
            user=USER,
        )
        status = job.wait(timeout=120, poll_interval=1.0, raise_on_failure=False)
        assert status.state is JobState.FAILED, status
        lines = [e.data for e in job.logs()]
        assert any("ValueError: compat-callable-boom" in l for l in lines), lines[-20:]
    r = ok(iris("job", "describe", job_id("callable-raises")))
    assert "compat-callable-boom" in r.out, r.describe()


def _rendezvous(name):
    """Task 0 of a gang serves a page and registers it; tasks 1-3 find it and fetch from it."""
    import http.server
    import threading
    import urllib.request

    from iris.client.client import iris_ctx

    ctx = iris_ctx()
    index = ctx.task_attempt.task_id.task_index
    if index == 0:
        fetched = []

        class Page(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = f"rendezvous-page {self.path}".encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                fetched.append(self.path)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        host = os.environ.get("IRIS_ADVERTISE_HOST", "127.0.0.1")
        ctx.registry.register(name, f"http://{host}:{server.server_address[1]}")
        deadline = time.time() + 100
        while len(fetched) < 3 and time.time() < deadline:
            time.sleep(0.1)
        print("rendezvous-served", sorted(fetched), flush=True)
        assert len(fetched) == 3, fetched
        # Keep serving a moment so the test sees the endpoint listed while the job runs.
        time.sleep(2)
    else:
        deadline = time.time() + 100
        while not (found := ctx.resolver.resolve(name)).endpoints:
            assert time.time() < deadline, f"no endpoint {name} registered"
            time.sleep(0.2)
        url = found.endpoints[0].url
        body = urllib.request.urlopen(f"{url}/from-{index}", timeout=10).read().decode()
        print(f"rendezvous-fetched {index} {body}", flush=True)


@step
def endpoints_rendezvous_in_a_coscheduled_gang():
    """Issue 16, acceptance 1: a 4-host gang finds its coordinator through the registry; the
    endpoint is listed while the job runs and gone when it ends."""
    from iris.client import IrisClient, JobState
    from iris.cluster.types import CoschedulingConfig, Entrypoint, ResourceSpec

    quiet_client_logs()
    with IrisClient.remote(ARGS.controller_url, workspace=Path(WORKSPACE)) as client:
        job = client.submit(
            Entrypoint.from_callable(_rendezvous, "coordinator"),
            name("rendezvous"),
            ResourceSpec(cpu=0.1, memory="256MB", disk="100MB"),
            replicas=4,
            coscheduling=CoschedulingConfig(group_by="scale-group"),
            user=USER,
        )
        endpoint = f"{job_id('rendezvous')}/coordinator"
        wait_until(
            "the coordinator endpoint to be listed",
            lambda: endpoint in ok(iris("endpoints", "list", job_id("rendezvous"))).out,
            timeout=120,
        )
        status = job.wait(timeout=180, poll_interval=1.0, raise_on_failure=False)
        lines = [e.data for e in job.logs()]
        assert status.state is JobState.SUCCEEDED, (status, lines[-20:])
        got = sorted(l for l in lines if l.startswith("rendezvous-fetched"))
        want = [f"rendezvous-fetched {i} rendezvous-page /from-{i}" for i in (1, 2, 3)]
        assert got == want, lines
    r = ok(iris("endpoints", "list", job_id("rendezvous")))
    assert endpoint not in r.out and "No endpoints found." in r.out, r.describe()


class _Calculator:
    def add(self, a, b):
        return {"sum": a + b}


def _serve_actor(name, seconds):
    """Serves `_Calculator` with the published ActorServer under the endpoint's full name."""
    from iris.actor.server import ActorServer
    from iris.client.client import iris_ctx

    ctx = iris_ctx()
    server = ActorServer(host="127.0.0.1")
    server.register(f"{ctx.namespace}/{name}", _Calculator())
    port = server.serve_background()
    ctx.registry.register(name, f"http://127.0.0.1:{port}")
    print("actor-up", flush=True)
    time.sleep(seconds)


@contextlib.contextmanager
def served_actor(tag):
    """Submits a task serving `_Calculator` under `<job>/calc` (published ActorServer) and
    yields the endpoint's name once it is listed; cancels the job afterwards."""
    from iris.client import IrisClient
    from iris.cluster.types import Entrypoint, ResourceSpec

    quiet_client_logs()
    with IrisClient.remote(ARGS.controller_url, workspace=Path(WORKSPACE)) as client:
        client.submit(
            Entrypoint.from_callable(_serve_actor, "calc", 600),
            name(tag),
            ResourceSpec(cpu=0.1, memory="256MB", disk="100MB"),
            user=USER,
        )
    endpoint = f"{job_id(tag)}/calc"
    try:
        wait_until(
            "the actor endpoint to be listed",
            lambda: endpoint in ok(iris("endpoints", "list", endpoint, "--exact")).out,
            timeout=120,
        )
        yield endpoint
    finally:
        iris("job", "cancel", job_id(tag))


def proxied_url(endpoint):
    """The endpoint's `/proxy` URL on our controller (dots for the name's slashes)."""
    return ARGS.controller_url.rstrip("/") + "/proxy/" + endpoint.strip("/").replace("/", ".")


@step
def actor_call_through_the_proxy():
    """Issue 16, acceptance 3: the published `iris actor call` reaches an actor served with the
    published library inside a task, through our controller's /proxy."""
    with served_actor("actor") as endpoint:
        # The published CLI sends a bearer with every actor call; without auth any token does.
        env = dict(os.environ, MARIN_CLUSTER_TOKEN="compat")
        r = subprocess.run(
            [ARGS.iris, "--controller-url", ARGS.controller_url, "actor", "call", endpoint, "add",
             '{"a": 2, "b": 40}'],
            capture_output=True, text=True, timeout=120, env=env, cwd=WORKSPACE,
        )
        assert r.returncode == 0 and '"sum": 42' in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
        # The `rpc actor` group talks to whatever URL it is given: the endpoint's /proxy path.
        for method, want in (("health-check", '"healthy": true'), ("list-actors", endpoint)):
            r = subprocess.run(
                [ARGS.iris, "--controller-url", proxied_url(endpoint), "rpc", "actor", method],
                capture_output=True, text=True, timeout=120, env=env, cwd=WORKSPACE,
            )
            assert r.returncode == 0 and want in r.stdout, (method, r.returncode, r.stdout, r.stderr[-2000:])


OURS = Path(__file__).resolve().parents[2] / "target" / "debug" / "iris"


def ours(*args, url=None, timeout=120):
    """Runs OUR CLI (the debug build) against `url` (default: the controller)."""
    argv = [str(OURS), "--controller-url", url or ARGS.controller_url, *args]
    proc = subprocess.run(argv, cwd=WORKSPACE, env=dict(os.environ, IRIS_USER=USER),
                          capture_output=True, text=True, timeout=timeout)
    return Result(["(ours)", *args], proc)


def published_rpc_tree():
    """{(service, method): sorted flags} from the published click tree."""
    import click
    from iris.cli.main import iris as published

    ctx = click.Context(published)
    rpc = published.commands["rpc"]
    tree = {}
    for service in ("controller", "worker", "actor"):
        group = rpc.get_command(ctx, service)
        for method in group.list_commands(ctx):
            cmd = group.get_command(ctx, method)
            flags = [o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
            tree[(service, method)] = sorted(flags)
    return tree


def help_section(text, title):
    """The lines of a clap help section (`Commands:`, `Options:`)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.strip() == title:
            inside = True
        elif inside and line and not line.startswith(" "):
            inside = False
        elif inside and line.strip():
            out.append(line)
    return out


@step
def ours_rpc_tree_matches_the_published():
    """Our `iris rpc controller|worker|actor` has the published CLI's methods, each with the
    published flags (--json plus one per singular scalar request field), leaf for leaf."""
    want = published_rpc_tree()
    got = {}
    for service in ("controller", "worker", "actor"):
        r = ok(ours("rpc", service, "--help"))
        methods = [l.split()[0] for l in help_section(r.out, "Commands:") if l.split()[0] != "help"]
        for method in methods:
            h = ok(ours("rpc", service, method, "--help")).out
            flags = re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", "\n".join(help_section(h, "Options:")), re.M)
            got[(service, method)] = sorted(f for f in flags if f not in ("--help", "--controller-url", "--verbose"))
    assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)))
    diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not diff, diff


@step
def ours_rpc_controller_calls():
    """OUR `iris rpc controller ...`: list-jobs and get-job-status --job-id print the reply as
    JSON; launch-job builds its request from --json plus field flags; an error status exits 1
    with its code and message."""
    import json

    job = submit("rpc-seen", ["true"])
    r = ok(ours("rpc", "controller", "list-jobs"))
    listed = [j["job_id"] for j in json.loads(r.out).get("jobs", [])]
    assert job in listed, r.describe()
    r = ok(ours("rpc", "controller", "get-job-status", "--job-id", job))
    assert json.loads(r.out)["job"]["job_id"] == job, r.describe()

    target = job_id("rpc-launch")
    body = json.dumps({
        "name": "overridden-by-the-flag",
        "entrypoint": {"runCommand": {"argv": ["true"]}},
        "resources": {"cpuMillicores": 100, "memoryBytes": str(256 << 20)},
    })
    launch = ["rpc", "controller", "launch-job", "--json", body, "--name", target, "--replicas", "2",
              "--max-task-failures", "1"]
    r = ok(ours(*launch))
    assert json.loads(r.out)["job_id"] == target, r.describe()

    def status():
        return json.loads(ok(ours("rpc", "controller", "get-job-status", "--job-id", target)).out)

    st = wait_until("the launched job to finish", lambda: (lambda s: s if s["job"]["state"] in (
        "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_KILLED") else None)(status()), timeout=120)
    assert st["job"]["state"] == "JOB_STATE_SUCCEEDED", st
    assert st["request"]["replicas"] == 2 and st["request"]["max_task_failures"] == 1, st["request"]
    assert st["request"]["entrypoint"]["run_command"]["argv"] == ["true"], st["request"]

    # Both CLIs print the proto's own field names (snake_case). (Theirs also prints the zero
    # values its explicit-presence protos carry; ours leaves them out: a subset, issue 19.)
    mine = json.loads(ok(ours("rpc", "controller", "get-job-status", "--job-id", target)).out)
    theirs = json.loads(ok(iris("rpc", "controller", "get-job-status", "--job-id", target)).out)
    for part in ("job", "request"):
        extra = set(mine[part]) - set(theirs[part])
        assert not extra and mine[part], (part, sorted(extra), sorted(theirs[part]))

    # --fail-if-exists refuses the existing name; --no-fail-if-exists replaces the finished job.
    r = ours(*launch, "--fail-if-exists")
    assert r.rc == 1 and r.err.startswith("error: ") and "(already_exists)" in r.err, r.describe()
    assert "RpcError" not in r.err and "Some(" not in r.err, r.describe()
    r = ok(ours(*launch, "--no-fail-if-exists"))
    assert json.loads(r.out)["job_id"] == target, r.describe()

    r = ours("rpc", "controller", "get-job-status", "--job-id", job_id("rpc-never-submitted"))
    assert r.rc == 1 and "(not_found)" in r.err and job_id("rpc-never-submitted") in r.err, r.describe()
    r = ours("rpc", "controller", "get-job-status", "--json", '{"jobid": "x"}')
    assert r.rc == 1 and "GetJobStatusRequest" in r.err and "jobId" in r.err, r.describe()


@step
def ours_actor_call_through_the_proxy():
    """OUR `iris actor call` pickles the kwargs, calls the actor through the controller's
    /proxy and prints the unpickled result as the published CLI does; an exception the method
    raises exits 1 with its type and message. OUR `rpc actor` reaches the proxied service."""
    import json

    with served_actor("our-actor") as endpoint:
        r = ok(ours("actor", "call", endpoint, "add", '{"a": 2, "b": 40}'))
        assert json.loads(r.out) == {"sum": 42} and r.out.startswith('{\n  "sum": 42'), r.describe()
        r = ours("actor", "call", endpoint, "add", '{"a": 2}')
        assert r.rc == 1 and "TypeError" in r.err and "b" in r.err, r.describe()
        r = ok(ours("rpc", "actor", "list-actors", url=proxied_url(endpoint)))
        assert endpoint in [a["name"] for a in json.loads(r.out)["actors"]], r.describe()
        r = ok(ours("rpc", "actor", "health-check", url=proxied_url(endpoint)))
        assert json.loads(r.out) == {"healthy": True}, r.describe()
    r = ours("actor", "call", job_id("no-such-actor") + "/calc", "add", "{}", "--timeout", "2")
    assert r.rc == 1 and "(not_found)" in r.err, r.describe()


@step
def job_logs_level_filters_by_each_lines_prefix():
    """Lines carry the reference's level prefixes on either stream; `--level warning` keeps
    exactly the WARNING and ERROR ones, in the published CLI and in ours."""
    script = (
        'echo "I20260102 12:00:00 lvl-info-out"; echo "W20260102 12:00:01 lvl-warn-out"; '
        'echo "I20260102 12:00:02 lvl-info-err" >&2; echo "E20260102 12:00:03 lvl-error-err" >&2; '
        'echo "[rank1] W20260102 12:00:04 lvl-warn-rank" >&2; echo "D20260102 12:00:05 lvl-debug-err" >&2; '
        'echo "lvl-plain-out"'
    )
    job = submit("levels", ["sh", "-c", script])
    wait_until("the levels job to finish", lambda: api_job_state(job) == "succeeded")
    want = ["lvl-warn-out", "lvl-error-err", "lvl-warn-rank"]
    ours = Path(__file__).resolve().parents[2] / "target" / "debug" / "iris"
    for label, argv in [
        ("published", [ARGS.iris]),
        ("ours", [str(ours)]),
    ]:
        proc = subprocess.run(
            [*argv, "--controller-url", ARGS.controller_url, "job", "logs", job, "--level", "warning"],
            cwd=WORKSPACE, env=dict(os.environ, IRIS_USER=USER), capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, f"{label}: {proc.stderr}"
        got = re.findall(r"lvl-[a-z-]+", proc.stdout)
        assert sorted(got) == sorted(want), f"{label}: {got}\n{proc.stdout}"


@step
def job_run_extra_syncs_the_workspace_before_the_command():
    """`--extra` renders the uv sync setup; the worker runs it in the task's workdir before the
    command, which then runs inside the synced venv. Without a pyproject.toml the sync is skipped
    with a notice. Through the published CLI and ours."""
    ours = str(Path(__file__).resolve().parents[2] / "target" / "debug" / "iris")
    cmd = 'echo "venv-active=${VIRTUAL_ENV:+yes}"; python -c "import sys; print(\'prefix-tail=\' + sys.prefix.rsplit(\'/\', 1)[-1])"'
    with tempfile.TemporaryDirectory(prefix="iris-compat-proj-") as proj:
        Path(proj, "pyproject.toml").write_text(
            '[project]\nname = "compat-sync"\nversion = "0.1.0"\nrequires-python = ">=3.12"\n'
            "dependencies = []\n\n[project.optional-dependencies]\nfast = []\n"
        )
        for label, cli in [("published", ARGS.iris), ("ours", ours)]:
            tag = f"sync-{label}"
            proc = subprocess.run(
                [cli, "--controller-url", ARGS.controller_url, "job", "run", "--no-wait", "--job-name", name(tag),
                 "--extra", "fast", "--", "sh", "-c", cmd],
                cwd=proj, env=dict(os.environ, IRIS_USER=USER), capture_output=True, text=True, timeout=120,
            )
            assert proc.returncode == 0, f"{label}: {proc.stderr}"
            wait_until(f"{label}: the synced job to finish", lambda: api_job_state(job_id(tag)) in ("succeeded", "failed"), timeout=180)
            r = ok(iris("job", "logs", job_id(tag), "--no-tail"))
            out = r.out
            assert api_job_state(job_id(tag)) == "succeeded", f"{label}:\n{out}"
            assert "[iris setup] step 1/2" in out and "syncing deps" in out, f"{label}:\n{out}"
            assert out.index("syncing deps") < out.index("venv-active=yes"), f"{label}:\n{out}"
            assert "prefix-tail=.venv" in out, f"{label}:\n{out}"
    # No pyproject.toml: nothing to sync; the notice says so and the command runs.
    job = submit("sync-none", ["echo", "sync-none-ran"], "--extra", "fast")
    wait_until("the unsynced job to finish", lambda: api_job_state(job) == "succeeded")
    out = ok(iris("job", "logs", job, "--no-tail")).out
    assert "skipped" in out and "no pyproject.toml" in out and "sync-none-ran" in out, out


@step
def secrets_reach_the_task_as_files_and_are_shown_nowhere():
    """`--secret NAME env:VAR` from the published CLI and from ours: the task reads the value
    from `$RIGGING_SECRETS_DIR/NAME` (it prints only a digest); `job describe`, the job's
    status, the logs and `query` never show the value, and the secrets table is not queryable."""
    import hashlib

    ours = str(Path(__file__).resolve().parents[2] / "target" / "debug" / "iris")
    for label, cli in [("published", ARGS.iris), ("ours", ours)]:
        value = f"compat-secret-{label}-{RUN_ID}"
        tag = f"secret-{label}"
        script = 'printf "digest=%s mode=%s\\n" "$(sha256sum < "$RIGGING_SECRETS_DIR/SERVICE_KEY" | cut -c1-16)" "$(stat -c %a "$RIGGING_SECRETS_DIR/SERVICE_KEY")"'
        proc = subprocess.run(
            [cli, "--controller-url", ARGS.controller_url, "job", "run", "--no-wait", "--job-name", name(tag),
             "--secret", "SERVICE_KEY", "env:COMPAT_SECRET_VALUE", "--", "sh", "-c", script],
            cwd=WORKSPACE, env=dict(os.environ, IRIS_USER=USER, COMPAT_SECRET_VALUE=value),
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, f"{label}: {proc.stderr}"
        wait_until(f"{label}: the secret job to finish", lambda: api_job_state(job_id(tag)) in ("succeeded", "failed"))
        logs = ok(iris("job", "logs", job_id(tag), "--no-tail")).out
        digest = hashlib.sha256(value.encode()).hexdigest()[:16]
        assert f"digest={digest} mode=400" in logs, f"{label}:\n{logs}"
        shown = [
            ok(iris("job", "describe", job_id(tag))).out,
            ok(iris("rpc", "controller", "get-job-status", "--json", '{"job_id": "%s"}' % job_id(tag))).out,
            logs,
            ok(iris("query", f"SELECT * FROM job_config WHERE job_id = '{job_id(tag)}'", "-f", "csv")).out,
            ok(iris("query", "SELECT * FROM jobs", "-f", "csv")).out,
        ]
        for text in shown:
            assert value not in text, f"{label}: the secret's value was shown:\n{text}"
    r = iris("query", "SELECT * FROM job_secrets")
    assert r.rc != 0, r.describe()


@step
def every_published_config_passes_our_dry_run():
    """Each config the published package ships loads in our controller (`--dry-run`); a
    misspelt key is refused with its path and the closest valid key."""
    import iris

    ours = str(Path(__file__).resolve().parents[2] / "target" / "debug" / "iris")
    config_dir = Path(iris.__file__).parent / "config"
    configs = sorted([*config_dir.glob("*.yaml"), *config_dir.glob("examples/*.yaml")])
    assert len(configs) >= 10, configs
    for cfg in configs:
        proc = subprocess.run([ours, "cluster", "controller", "serve", "--config", str(cfg), "--dry-run"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "OK: the config is valid" in proc.stdout, f"{cfg.name}:\n{proc.stdout}\n{proc.stderr}"
        assert "Scale groups:" in proc.stdout, f"{cfg.name}:\n{proc.stdout}"
    with tempfile.TemporaryDirectory() as d:
        bad = Path(d, "bad.yaml")
        bad.write_text((config_dir / "examples" / "coreweave.yaml").read_text().replace("scale_groups:", "scale_group:", 1))
        proc = subprocess.run([ours, "cluster", "controller", "serve", "--config", str(bad), "--dry-run"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "did you mean `scale_groups`?" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------------------------


@step
def tokens_interoperate_with_the_python_implementation():
    """Our `iris user token mint` output verifies with the published verifier, and a key from
    our `iris cluster init-keys` loads in Python with the same kid."""
    from rigging.token_authority import JwksVerifier, signing_key_from_private_pem

    ours = Path(__file__).resolve().parents[2] / "target" / "debug" / "iris"
    with tempfile.TemporaryDirectory() as d:
        key = Path(d) / "k.pem"
        out = subprocess.run([str(ours), "cluster", "init-keys", "--out-file", str(key)], capture_output=True, text=True, check=True).stdout
        kid = next(l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("kid:"))
        py_key = signing_key_from_private_pem(key.read_text())
        assert py_key.kid == kid, (py_key.kid, kid)
        token = subprocess.run(
            [str(ours), "user", "token", "mint", "alice", "--signing-key", f"file:{key}", "--issuer", "compat", "--ttl", "1h"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        claims = JwksVerifier(issuers={"compat": [py_key.public_pem]}, expected_audiences=frozenset({"iris"})).verify(token)
        assert claims.sub == "alice" and claims.claims["role"] == "user", claims


# --------------------------------------------------------------------------------------------
# The published command tree, leaf for leaf and flag for flag


def _ours():
    return str(Path(__file__).resolve().parents[2] / "target" / "debug" / "iris")


def published_leaves():
    """Every leaf command of the published CLI's click tree (lazy groups included) with the
    flags it takes: {"job run": {"--cpu", ...}}."""
    import click
    from iris.cli.main import iris as root

    out = {}

    def walk(cmd, path, ctx):
        if isinstance(cmd, click.Group):
            for sub_name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, sub_name)
                if sub is None or sub.hidden:
                    continue
                walk(sub, path + [sub_name], click.Context(sub, parent=ctx, info_name=sub_name))
            return
        flags = set()
        for p in cmd.params:
            if isinstance(p, click.Option):
                flags.update(o for o in [*p.opts, *p.secondary_opts] if o.startswith("-"))
        out[" ".join(path)] = flags

    walk(root, [], click.Context(root, info_name="iris"))
    return out


def our_leaf(path):
    """Whether our CLI has the command `path` as a leaf, and the flags its `--help` lists."""
    proc = subprocess.run([_ours(), *path.split(), "--help"], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return None, proc.stderr
    flags, section = set(), None
    for line in proc.stdout.splitlines():
        m = re.match(r"^(\w[\w ]*):\s*$", line)
        if m:
            section = m.group(1)
            continue
        if section == "Options":
            m = re.match(r"^\s+((?:-\w, )?--[\w-]+|-\w)(?:[ =]|$)", line)
            if m:
                flags.update(m.group(1).split(", "))
    return flags, proc.stdout


@step
def every_published_command_and_flag_exists_in_ours():
    """A walk over the published CLI's click tree: each leaf command exists in ours (as a
    leaf: its `--help` lists options) and takes every flag the published one takes."""
    leaves = published_leaves()
    assert len(leaves) > 100, f"the walk found only {len(leaves)} leaves"
    missing = []
    for path, flags in sorted(leaves.items()):
        ours, text = our_leaf(path)
        if ours is None:
            missing.append(f"iris {path}: no such command ({text.strip().splitlines()[-1] if text.strip() else ''})")
            continue
        lacking = sorted(f for f in flags if f not in ours)
        if lacking:
            missing.append(f"iris {path}: lacks {', '.join(lacking)}")
    assert not missing, f"{len(missing)} of {len(leaves)} published leaves differ:\n  " + "\n  ".join(missing)


def run_ours(*args, timeout=60):
    return subprocess.run([_ours(), "--controller-url", ARGS.controller_url, *args],
                          capture_output=True, text=True, timeout=timeout)


@step
def cluster_vm_status_and_logs_show_the_scale_group_and_its_workers():
    """`cluster vm status` and `cluster vm logs` (published and ours) read GetAutoscalerStatus
    and GetWorkerStatus: the compat cluster's `cpu` group with its four local workers."""
    r = ok(iris("cluster", "vm", "status"))
    assert "Scale Group: cpu" in r.out and "Slices: 4/4 ready" in r.out, r.describe()
    vm_ids = re.findall(r"^\s+(worker-\S+): VM_STATE_READY \(", r.out, re.M)
    assert len(vm_ids) == 4, r.describe()
    o = run_ours("cluster", "vm", "status", "--scale-group", "cpu")
    assert o.returncode == 0 and "Slices: 4/4 ready" in o.stdout, o.stdout + o.stderr
    assert all(v in o.stdout for v in vm_ids), o.stdout
    o = run_ours("cluster", "vm", "status", "--scale-group", "gpu-nope")
    assert o.returncode != 0 and "no such scale group" in o.stderr and "cpu" in o.stderr, o.stderr
    r = ok(iris("cluster", "vm", "logs", vm_ids[0]))
    assert f"Worker: {vm_ids[0]}" in r.out and "Healthy: True" in r.out, r.describe()
    o = run_ours("cluster", "vm", "logs", vm_ids[0])
    assert o.returncode == 0 and f"Worker: {vm_ids[0]}" in o.stdout and "Healthy: true" in o.stdout, o.stdout
    r = iris("cluster", "vm", "logs", "no-such-worker")
    assert r.rc != 0 and "not found" in (r.out + r.err), r.describe()


@step
def unsupported_commands_say_why():
    """Image builds and VM re-bootstraps answer with the reason and exit 2; create-slice on a
    local cluster is refused as the published CLI refuses it."""
    for args in (["build", "all"], ["build", "worker-image", "--push"], ["cluster", "controller", "worker-restart"]):
        o = subprocess.run([_ours(), *args], capture_output=True, text=True, timeout=30)
        assert o.returncode == 2 and "not supported by this controller" in o.stderr, (args, o.stderr)
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d, "local.yaml")
        cfg.write_text("name: c\nplatform: {local: {}}\ncontroller: {local: {port: 0}}\n")
        o = subprocess.run([_ours(), "--config", str(cfg), "cluster", "create-slice", "--scale-group", "cpu"],
                           capture_output=True, text=True, timeout=30)
        assert o.returncode != 0 and "not supported for local clusters" in o.stderr, o.stderr



# --- process diagnostics: exec, profiles, process status and logs (both CLIs) ---------------

# A Python task that reports its working directory once and then sleeps in a named loop.
_DIAG_LOOP = (
    "import os, sys, time\n"
    "print('compat-cwd=' + os.getcwd(), flush=True)\n"
    "def compat_sleepy_loop():\n"
    "    while True:\n"
    "        time.sleep(0.2)\n"
    "compat_sleepy_loop()\n"
)
_DIAG = {}


def diag_task():
    """One running Python task (submitted once, shared by the diagnostics steps): its id and the
    working directory it printed."""
    if "task" not in _DIAG:
        job = submit("diag", ["python3", "-c", _DIAG_LOOP], "-e", "COMPAT_EXEC_VAR", "given-with-e")
        task = f"{job}/0"
        wait_until(f"{task} running", lambda: api_task_state(task) == "running", timeout=120)

        def cwd():
            r = iris("task", "logs", task)
            m = re.search(r"compat-cwd=(\S+)", r.out)
            return m and m.group(1)

        _DIAG.update(task=task, cwd=wait_until(f"{task} to print its directory", cwd, timeout=60))
    return _DIAG["task"], _DIAG["cwd"]


def both_clis():
    """(name, runner) for the published CLI and ours."""
    return [("published", iris), ("ours", ours)]


@step
def task_exec_runs_in_the_tasks_directory_with_its_env():
    task, cwd = diag_task()
    for who, cli in both_clis():
        r = ok(cli("task", "exec", task, "--", "sh", "-c", "pwd; echo var=$COMPAT_EXEC_VAR; echo id=$IRIS_TASK_ID"))
        lines = r.out.splitlines()
        # IRIS_TASK_ID names the attempt too (`<task>:<N>`), as the task itself sees it.
        assert lines[:3] == [cwd, "var=given-with-e", f"id={task}:0"], (who, r.describe())
        r = cli("task", "exec", task, "--", "sh", "-c", "echo oops >&2; exit 3")
        assert r.rc == 3 and "oops" in r.err, (who, r.describe())


@step
def task_exec_of_a_finished_task_is_refused():
    job = submit("exec-done", ["true"])
    wait_until(f"{job} succeeded", lambda: api_job_state(job) == "succeeded", timeout=120)
    for who, cli in both_clis():
        r = cli("task", "exec", f"{job}/0", "--", "pwd")
        assert r.rc != 0 and "not running" in r.out + r.err, (who, r.describe())


@step
def task_profile_threads_shows_the_python_stack():
    task, _ = diag_task()
    for who, cli in both_clis():
        r = ok(cli("task", "profile", task, "threads", timeout=180))
        assert "compat_sleepy_loop" in r.out, (who, r.describe())


@step
def process_status_shows_the_controller():
    for who, cli in both_clis():
        r = ok(cli("process", "status"))
        assert "=== Controller Process Status ===" in r.out, (who, r.describe())
        assert re.search(r"^PID:\s+\d+$", r.out, re.M), (who, r.describe())
        assert re.search(r"^Uptime:\s+\S+", r.out, re.M), (who, r.describe())
        assert re.search(r"iris controller \d+\.\d+\.\d+", r.out), (who, r.describe())


@step
def process_logs_substring_finds_a_controller_line():
    job = submit("logged", ["true"])
    for who, cli in both_clis():
        r = ok(cli("process", "logs", "--substring", job))
        hits = [l for l in r.out.splitlines() if job in l]
        assert hits and all("job accepted" in l for l in hits), (who, r.describe())
        r = ok(cli("process", "logs", "--substring", f"{job}-never-logged"))
        assert r.out.strip() == "", (who, r.describe())


@step
def process_status_of_a_worker():
    import json

    r = ok(ours("rpc", "controller", "list-workers"))
    worker = json.loads(r.out)["workers"][0]["worker_id"]
    for who, cli in both_clis():
        r = ok(cli("process", "status", "-t", f"/system/worker/{worker}"))
        assert f"=== /system/worker/{worker} Process Status ===" in r.out, (who, r.describe())
        assert re.search(r"iris worker \d+\.\d+\.\d+", r.out), (who, r.describe())


# Published leaves the suite does not run against our controller, each with why.
IMAGE = "builds and pushes container images (needs docker and a registry), not a client of a running controller"
OWN_CONTROLLER = "starts, stops or restarts the published package's own controller or cluster, not a client of ours"
NOT_RUN = {
    "build all": IMAGE,
    "build controller-image": IMAGE,
    "build dashboard": "builds the published dashboard's frontend bundle (npm), not a client of a running controller",
    "build push": IMAGE,
    "build task-image": IMAGE,
    "build worker-image": IMAGE,
    "cluster start": OWN_CONTROLLER,
    "cluster stop": OWN_CONTROLLER,
    "cluster restart": OWN_CONTROLLER,
    "cluster controller serve": OWN_CONTROLLER,
    "cluster controller restart": "rolls a GCP/CoreWeave controller deployment (VM or Deployment) from its config",
    "cluster controller worker-restart": "restarts GCP/CoreWeave worker VMs or pods from the cluster config",
    "cluster create-slice": "creates a cloud slice through the platform API from the cluster config",
    "cluster delete-slice": "deletes a cloud slice through the platform API from the cluster config",
    "cluster dashboard": "keeps an SSH / port-forward tunnel to a cloud controller open until interrupted",
    "cluster dashboard-proxy": "serves a local proxy to a cloud controller's dashboard until interrupted",
    "cluster log-server up": "deploys the standalone finelog server VM / Deployment from the cluster config",
    "cluster log-server down": "tears down the standalone finelog server VM / Deployment",
    "cluster log-server restart": "restarts the standalone finelog server VM / Deployment",
    "cluster log-server status": "reads the standalone finelog server's VM / Deployment status from the cloud",
    "cluster log-server logs": "reads the standalone finelog server VM's / pod's own logs from the cloud",
    "attempt wait": "the published CLI fails before any call: it waits with `timeout=float('inf')`, which its "
                    "`Deadline.from_seconds` cannot convert (OverflowError, marin-iris 0.2.227); our `iris attempt "
                    "wait` is run by crates/cli/tests",
    "task wait": "as attempt wait: `timeout=float('inf')` overflows in the published CLI before any call; "
                 "our `iris task wait` is run by crates/cli/tests",
    "rpc controller register": "registers a worker: sent by anyone but a worker daemon it would hand tasks to a "
                               "worker that does not exist (every local worker registers through it)",
    "rpc worker reconcile": "replaces the worker's desired set: sent by anyone but the controller it stops the "
                            "worker's tasks (the controller sends it every second)",
    "rpc actor cancel-operation": "talks to the actor server (the published library inside the task) only; our "
                                  "part, /proxy, is run by `rpc actor health-check`, `list-actors` and `actor call`",
    "rpc actor get-operation": "as rpc actor cancel-operation",
    "rpc actor start-operation": "as rpc actor cancel-operation",
    "rpc actor call": "as rpc actor cancel-operation",
    "rpc actor list-methods": "as rpc actor cancel-operation",
}


def every_published_leaf_ran_or_is_listed():
    leaves = set(_leaves())
    missing = sorted(leaves - RAN_LEAVES - set(NOT_RUN))
    assert not missing, f"{len(missing)} published leaves neither ran nor are listed in NOT_RUN: {missing}"
    stale = sorted(set(NOT_RUN) & RAN_LEAVES)
    assert not stale, f"listed in NOT_RUN but ran (remove them from the list): {stale}"
    unknown = sorted(set(NOT_RUN) - leaves)
    assert not unknown, f"NOT_RUN names leaves the published CLI does not have: {unknown}"


@step
def attempt_commands_address_one_attempt():
    j = submit("attempts", SLEEP, "--max-retries", "2")
    t = f"{j}/0"
    wait_until(f"{t} running", lambda: api_task_state(t) == "running")
    r = ok(iris("attempt", "describe", f"{t}:0"))
    assert f"{t}:0" in r.out and "running" in r.out.lower(), r.describe()
    ok(iris("attempt", "logs", f"{t}:0", "--no-tail"))
    r = ok(iris("attempt", "profile", f"{t}:0", "threads", timeout=180))
    assert "sleep" in r.out.lower() or "thread" in r.out.lower(), r.describe()
    ok(iris("attempt", "preempt", f"{t}:0", "--reason", "compat attempt preempt"))
    r = wait_until(f"{t}:0 preempted", lambda: "preempted" in (r := iris("attempt", "describe", f"{t}:0")).out.lower() and r)
    wait_until(f"{t} running again", lambda: api_task_state(t) == "running", timeout=120)
    ok(iris("attempt", "fail", f"{t}:1", "--reason", "compat attempt fail"))
    wait_until(f"{t}:1 failed", lambda: "failed" in iris("attempt", "describe", f"{t}:1").out.lower())
    # `attempt fail` fails the task without a retry.
    r = ok(iris("task", "list", j))
    assert re.search(r"^\s*TASK\s+STATE\s+BACKEND\s+ATTEMPT", r.out, re.M), r.describe()
    assert re.search(r"^\s*0\s+failed\s+\S+\s+1\s+Failed by operator", r.out, re.M), r.describe()


def rpc_json(r):
    import json

    assert r.rc == 0, r.describe()
    return json.loads(r.out)


@step
def rpc_controller_calls_from_the_published_cli():
    """Every `rpc controller` leaf of the published CLI against our controller, with real
    arguments; each answer is checked for the field that says it worked (or the refusal)."""
    import json

    task, _ = diag_task()
    job = task.rsplit("/", 1)[0]
    worker = rpc_json(ours("rpc", "controller", "list-workers"))["workers"][0]["worker_id"]
    done = submit("rpc-done", ["true"])
    wait_until(f"{done} succeeded", lambda: api_job_state(done) == "succeeded")
    victim = submit("rpc-victim", SLEEP)
    wait_until(f"{victim}/0 running", lambda: api_task_state(f"{victim}/0") == "running")
    completer = submit("rpc-complete", SLEEP)
    launch = {"name": f"/{USER}/{name('rpc-launch')}",
              "entrypoint": {"run_command": {"argv": ["true"]}},
              "resources": {"cpu_millicores": 100, "memory_bytes": 104857600}}

    def call(method, *args):
        return iris("rpc", "controller", method, *args)

    checks = [
        ("list-jobs", [], lambda d: any(j["job_id"] == done for j in d["jobs"])),
        ("get-job-status", ["--job-id", done], lambda d: d["job"]["state"] == "JOB_STATE_SUCCEEDED"),
        ("get-job-state", ["--json", json.dumps({"job_ids": [done]})], lambda d: done in d["states"]),
        ("list-tasks", ["--job-id", done], lambda d: d["tasks"][0]["state"] == "TASK_STATE_SUCCEEDED"),
        ("get-task-status", ["--task-id", f"{done}/0"], lambda d: d["task"]["task_id"] == f"{done}/0"),
        ("list-workers", [], lambda d: any(w["worker_id"] == worker for w in d["workers"])),
        ("get-worker-status", ["--id", worker], lambda d: d["worker"]["worker_id"] == worker),
        ("list-users", [], lambda d: any(u["user"] == USER for u in d["users"])),
        ("get-current-user", [], lambda d: "user_id" in d),
        ("list-user-budgets", [], lambda d: "users" in d or d == {}),
        ("get-user-budget", ["--user-id", USER], lambda d: d.get("user_id", USER) == USER),
        ("set-user-budget", ["--json", json.dumps({"user_id": "rpc-budget", "budget_limit": 5})], lambda d: True),
        ("get-scheduler-state", [], lambda d: isinstance(d, dict)),
        ("get-autoscaler-status", [], lambda d: "status" in d),
        ("get-process-status", [], lambda d: d["process_info"]["pid"] > 0),
        ("list-backends", [], lambda d: len(d["backends"]) >= 1),
        ("list-peers", [], lambda d: isinstance(d, dict)),
        ("execute-raw-query", ["--sql", "SELECT count(*) AS n FROM jobs"], lambda d: d["columns"][0]["name"] == "n"),
        ("exec-in-container", ["--task-id", task, "--json", json.dumps({"task_id": task, "command": ["echo", "rpc-exec"]})],
         lambda d: "rpc-exec" in d.get("stdout", "")),
        ("profile-task", ["--json", json.dumps({"target": task, "duration_seconds": 1,
                                                "profile_type": {"threads": {}}})],
         lambda d: "profile_data" in d or "error" in d),
        ("begin-checkpoint", [], lambda d: "checkpoint_path" in d or "created_at" in d or d != {}),
        ("kick-tasks", ["--json", json.dumps({"targets": [f"{victim}/0"], "desired_state": "TASK_STATE_PREEMPTED",
                                               "reason": "compat rpc kick"})], lambda d: True),
        ("terminate-job", ["--job-id", victim], lambda d: True),
        ("complete-job", ["--job-id", completer], lambda d: True),
        ("launch-job", ["--json", json.dumps(launch)], lambda d: d["job_id"] == launch["name"]),
        # Nothing was handed to the caller (no peers): no jobs, and our users' spend.
        ("federation-sync", ["--json", json.dumps({"cursor": "0"})],
         lambda d: d["next_cursor"] == "0" and d["budget_usage"]["spend"].get(USER)),
    ]
    for method, args, good in checks:
        r = call(method, *args)
        try:
            d = rpc_json(r)
        except (AssertionError, ValueError):
            raise AssertionError(f"rpc controller {method}: {r.describe()}")
        assert good(d), f"rpc controller {method}: {json.dumps(d)[:800]}"
    # Refused here, each with a message saying why (auth off; no federation; no Kubernetes).
    for method, args, needle in [
        ("mint-endpoint-token", ["--json", json.dumps({"endpoint_name": "/x"})], "auth"),
        ("renew-worker-token", ["--json", "{}"], "auth"),
        ("get-kubernetes-cluster-status", [], "kubernetes"),
    ]:
        r = call(method, *args)
        assert r.rc != 0 and needle in (r.out + r.err).lower(), f"rpc controller {method}: {r.describe()}"


@step
def rpc_worker_calls_reach_a_worker():
    import json

    task, _ = diag_task()
    workers = rpc_json(ours("rpc", "controller", "list-workers"))["workers"]
    status = rpc_json(iris("rpc", "controller", "get-task-status", "--task-id", task))["task"]
    w = next(w for w in workers if w["worker_id"] == status["worker_id"])
    url = w["address"] if w["address"].startswith("http") else f"http://{w['address']}"

    def call(method, *args):
        return subprocess.run(
            [ARGS.iris, "--controller-url", url, "rpc", "worker", method, *args],
            capture_output=True, text=True, timeout=180, cwd=WORKSPACE,
        )

    for method, args, good in [
        ("health-check", [], lambda d: d["healthy"] is True),
        ("get-process-status", [], lambda d: d["process_info"]["pid"] > 0),
        ("list-tasks", [], lambda d: any(t["task_id"] == task for t in d["tasks"])),
        ("get-task-status", ["--task-id", task], lambda d: d["task_id"] == task and d["state"] == "TASK_STATE_RUNNING"),
        ("exec-in-container", ["--json", json.dumps({"task_id": task, "command": ["echo", "worker-exec"]})],
         lambda d: "worker-exec" in d.get("stdout", "")),
        ("profile-task", ["--json", json.dumps({"target": task, "duration_seconds": 1,
                                                "profile_type": {"threads": {}}})],
         lambda d: "profile_data" in d),
    ]:
        r = call(method, *args)
        assert r.returncode == 0, f"rpc worker {method}: {r.stdout}\n{r.stderr[-2000:]}"
        d = json.loads(r.stdout)
        assert good(d), f"rpc worker {method}: {json.dumps(d)[:800]}"


@step
def cluster_status_list_checkpoint_and_keys():
    # The published `cluster status`: GetProcessStatus (its version), ListWorkers and
    # GetAutoscalerStatus (the compat cluster's `cpu` group); uptime is `process status`'s.
    r = ok(iris("cluster", "status"))
    assert "Running: True" in r.out and "Workers: 4/4 healthy" in r.out, r.describe()
    assert re.search(r"^\s+Version: \S+", r.out, re.M), r.describe()
    assert "No scale groups configured" not in r.out and re.search(r"^.*\bcpu\b", r.out.split("Autoscaler Status:")[-1], re.M), r.describe()
    r = ok(iris("cluster", "list"))
    r = ok(iris("cluster", "controller", "checkpoint"))
    assert "checkpoint" in r.out.lower() + r.err.lower(), r.describe()
    with tempfile.TemporaryDirectory(prefix="iris-compat-keys-") as d:
        key = Path(d, "signing.pem")
        r = ok(iris("cluster", "init-keys", "--out-file", str(key)))
        assert "PRIVATE KEY" in key.read_text(), r.describe()


@step
def process_profile_of_the_controller():
    with tempfile.TemporaryDirectory(prefix="iris-compat-prof-") as d:
        out = Path(d, "controller-threads.txt")
        r = ok(iris("process", "profile", "threads", "-o", str(out), timeout=180))
        assert out.exists() and out.stat().st_size > 0, r.describe()
    # The capture is kept in iris.profile, as the published controller keeps it.
    from finelog.client import LogClient

    c = LogClient.connect(ARGS.controller_url + "/proxy/system.log-server")
    rows = c.query('SELECT source, type, format, length(profile_data) AS n FROM "iris.profile" '
                   "WHERE source = '/system/controller'").to_pylist()
    assert any(r["type"] == "thread" and r["n"] > 0 for r in rows), rows


@step
def endpoints_mint_and_login_without_auth_say_auth_is_off():
    r = iris("endpoints", "mint", "/compat/no-such-endpoint")
    assert r.rc != 0 and "auth" in (r.out + r.err).lower(), r.describe()
    r = iris("login", "--headless", timeout=60, stdin="")
    assert "no login is needed" in r.out + r.err, r.describe()


def main():
    global ARGS, WORKSPACE
    p = argparse.ArgumentParser()
    p.add_argument("--controller-url", required=True)
    p.add_argument("--iris", required=True, help="the published iris CLI")
    p.add_argument("--cluster-log", help="printed (tail) when a step fails")
    p.add_argument("-k", default="", help="run only steps whose name contains one of these (comma-separated)")
    ARGS = p.parse_args()
    install_leaf_ledger()
    with tempfile.TemporaryDirectory(prefix="iris-compat-ws-") as ws:
        WORKSPACE = ws
        Path(ws, "data.txt").write_text("compat-data-file-contents\n")
        passed = failed = 0
        for fn in STEPS:
            if ARGS.k and not any(k and k in fn.__name__ for k in ARGS.k.split(",")):
                continue
            t0 = time.monotonic()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - report every failure and go on
                failed += 1
                detail = str(e) if isinstance(e, AssertionError) and str(e) else traceback.format_exc()
                print(f"FAIL {fn.__name__} ({time.monotonic() - t0:.1f}s)\n    " + detail.replace("\n", "\n    "), flush=True)
            else:
                passed += 1
                print(f"ok   {fn.__name__} ({time.monotonic() - t0:.1f}s)", flush=True)
        if not ARGS.k:
            # Last: every leaf of the published CLI ran in some step, or is listed with why not.
            t0 = time.monotonic()
            try:
                every_published_leaf_ran_or_is_listed()
            except AssertionError as e:
                failed += 1
                print(f"FAIL every_published_leaf_ran_or_is_listed ({time.monotonic() - t0:.1f}s)\n    {e}", flush=True)
            else:
                passed += 1
                print(f"ok   every_published_leaf_ran_or_is_listed ({len(RAN_LEAVES)} leaves ran, "
                      f"{len(NOT_RUN)} listed)", flush=True)
        if _CLIENT is not None:
            _CLIENT.shutdown()
        if failed and ARGS.cluster_log and Path(ARGS.cluster_log).exists():
            tail = Path(ARGS.cluster_log).read_text(errors="replace").splitlines()[-40:]
            print("--- last lines of the cluster's log\n" + "\n".join(tail), flush=True)
        print(f"{passed} passed, {failed} failed", flush=True)
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
