"""finelog StatsService benchmark: WriteRows throughput and Query latency over N stored rows.

Run by scripts/bench-stats.sh against our controller (`/proxy/system.log-server`) and, for the
ratio, against the published finelog server (marin-finelog-server's EmbeddedServer, in its own
process), with the same pre-encoded Arrow batches and the same queries.

    python bench-stats.py --url URL [--url URL ...] [--rows 1000000] [--batch 10000]

Rows are `iris.task_event`-shaped: 10,000 tasks, one attempt uid each, 9 columns. Prints, per
server, rows/s for the writes and the median / p99 of each query.
"""

import argparse
import datetime
import io
import statistics
import time

import pyarrow as pa
import pyarrow.ipc as ipc
from finelog.rpc import finelog_stats_pb2 as pb
from finelog.rpc.finelog_stats_connect import StatsServiceClientSync

NS = "bench.task_event"
TASKS = 10_000

SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("attempt_id", pa.int64()),
        ("attempt_uid", pa.string()),
        ("ts", pa.timestamp("ms")),
        ("type", pa.string()),
        ("reason", pa.string()),
        ("message", pa.string()),
        ("source", pa.string()),
        ("count", pa.int64()),
    ]
)

COLUMN_TYPES = {
    pa.string(): pb.COLUMN_TYPE_STRING,
    pa.int64(): pb.COLUMN_TYPE_INT64,
    pa.timestamp("ms"): pb.COLUMN_TYPE_TIMESTAMP_MS,
}


def batches(rows, size):
    start = datetime.datetime(2026, 12, 1)
    out = []
    for first in range(0, rows, size):
        n = min(size, rows - first)
        idx = range(first, first + n)
        batch = pa.record_batch(
            [
                pa.array([f"/bench/job-{i % TASKS}/0" for i in idx]),
                pa.array([0] * n, pa.int64()),
                pa.array([f"uid-{i % TASKS}" for i in idx]),
                pa.array([start + datetime.timedelta(milliseconds=i) for i in idx], pa.timestamp("ms")),
                pa.array(["Normal"] * n),
                pa.array(["TaskRunning"] * n),
                pa.array([f"event {i} of the benchmark" for i in idx]),
                pa.array(["iris/worker"] * n),
                pa.array([1] * n, pa.int64()),
            ],
            schema=SCHEMA,
        )
        sink = io.BytesIO()
        with ipc.new_stream(sink, SCHEMA) as w:
            w.write_batch(batch)
        out.append((n, sink.getvalue()))
    return out


QUERIES = [
    (
        "task events of one task (the CLI's query)",
        "SELECT attempt_id, ts, type, reason, message, source, count FROM ("
        f"SELECT attempt_id, ts, type, reason, message, source, count FROM \"{NS}\" "
        "WHERE task_id = '/bench/job-4242/0' AND attempt_uid IN ('uid-4242') ORDER BY ts DESC LIMIT 100"
        ") AS recent ORDER BY ts ASC",
    ),
    ("count(*) of every row", f'SELECT count(*) AS n FROM "{NS}"'),
    (
        "top 10 tasks by events (full scan, group by)",
        f'SELECT task_id, count(*) AS n FROM "{NS}" GROUP BY task_id ORDER BY n DESC LIMIT 10',
    ),
]


def bench(url, data, runs):
    client = StatsServiceClientSync(url, timeout_ms=600_000)
    schema = pb.Schema(
        key_column="task_id",
        columns=[pb.Column(name=f.name, type=COLUMN_TYPES[f.type], nullable=False) for f in SCHEMA],
    )
    client.register_table(pb.RegisterTableRequest(namespace=NS, schema=schema))
    rows = sum(n for n, _ in data)
    t = time.perf_counter()
    for n, blob in data:
        written = client.write_rows(pb.WriteRowsRequest(namespace=NS, arrow_ipc=blob)).rows_written
        assert written == n, (written, n)
    write_s = time.perf_counter() - t
    print(f"  WriteRows: {rows} rows in {write_s:.2f} s = {rows / write_s:,.0f} rows/s ({len(data)} calls)")
    # Wait until every row is visible (the published server buffers before it seals).
    deadline = time.time() + 120
    while True:
        r = client.query(pb.QueryRequest(sql=f'SELECT count(*) AS n FROM "{NS}"'))
        seen = ipc.open_stream(r.arrow_ipc).read_all().column(0)[0].as_py()
        if seen == rows or time.time() > deadline:
            break
        time.sleep(0.2)
    print(f"  rows visible: {seen}")
    for label, sql in QUERIES:
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            r = client.query(pb.QueryRequest(sql=sql))
            ipc.open_stream(r.arrow_ipc).read_all()
            times.append((time.perf_counter() - t) * 1000)
        times.sort()
        p99 = times[min(len(times) - 1, len(times) * 99 // 100)]
        print(f"  Query {label}: median {statistics.median(times):.1f} ms, p99 {p99:.1f} ms ({runs} runs)")
    client.drop_table(pb.DropTableRequest(namespace=NS))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def hour_of_samples(url, pid, tasks, every_s):
    """An hour of `iris.task` samples from `tasks` tasks, one batch per sampling round (what the
    controller writes for them), then the newest sample of each task (what `job describe`
    reads): the server's RSS before and after."""
    client = StatsServiceClientSync(url, timeout_ms=600_000)
    cols = [("task_id", pa.string()), ("attempt_id", pa.int64()), ("worker_id", pa.string()),
            ("ts", pa.timestamp("ms")), ("cpu_millicores", pa.int64()), ("memory_mb", pa.int64()),
            ("disk_mb", pa.int64()), ("memory_peak_mb", pa.int64())]
    schema = pa.schema(cols)
    client.register_table(pb.RegisterTableRequest(namespace="bench.task", schema=pb.Schema(
        key_column="task_id",
        columns=[pb.Column(name=n, type=COLUMN_TYPES[t], nullable=True) for n, t in cols])))
    before = rss_kib(pid) if pid else 0
    rounds = 3600 // every_s
    start = datetime.datetime(2026, 12, 1)
    t = time.perf_counter()
    for r in range(rounds):
        ts = start + datetime.timedelta(seconds=r * every_s)
        batch = pa.record_batch([
            pa.array([f"/bench/job/{i}" for i in range(tasks)]),
            pa.array([0] * tasks, pa.int64()),
            pa.array([f"worker-{i % 10}" for i in range(tasks)]),
            pa.array([ts] * tasks, pa.timestamp("ms")),
            pa.array([(r * 37 + i) % 4000 for i in range(tasks)], pa.int64()),
            pa.array([1000 + (r + i) % 500 for i in range(tasks)], pa.int64()),
            pa.array([0] * tasks, pa.int64()),
            pa.array([1500] * tasks, pa.int64()),
        ], schema=schema)
        sink = io.BytesIO()
        with ipc.new_stream(sink, schema) as w:
            w.write_batch(batch)
        client.write_rows(pb.WriteRowsRequest(namespace="bench.task", arrow_ipc=sink.getvalue()))
    took = time.perf_counter() - t
    keys = ", ".join(f"'/bench/job/{i}'" for i in range(tasks))
    q = time.perf_counter()
    r = client.query(pb.QueryRequest(sql=(
        'SELECT task_id, memory_mb, memory_peak_mb FROM "bench.task" WHERE seq IN '
        f'(SELECT max(seq) FROM "bench.task" WHERE task_id IN ({keys}) GROUP BY task_id)')))
    latest = ipc.open_stream(r.arrow_ipc).read_all()
    q_ms = (time.perf_counter() - q) * 1000
    assert latest.num_rows == tasks, latest.num_rows
    after = rss_kib(pid) if pid else 0
    print(f"  an hour of samples: {rounds * tasks} rows ({tasks} tasks every {every_s} s) written in {took:.2f} s; "
          f"newest sample of each task in {q_ms:.1f} ms")
    if pid:
        print(f"  server RSS before {before / 1024:.0f} MiB, after {after / 1024:.0f} MiB")
    client.drop_table(pb.DropTableRequest(namespace="bench.task"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", action="append", required=True, help="NAME=URL of a StatsService")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--pid", action="append", default=[], help="NAME=PID of a server, for its RSS")
    p.add_argument("--sample-tasks", type=int, default=100)
    a = p.parse_args()
    pids = dict(spec.partition("=")[::2] for spec in a.pid)
    data = batches(a.rows, a.batch)
    for spec in a.url:
        name, _, url = spec.partition("=")
        print(f"{name} ({url}):")
        hour_of_samples(url, int(pids.get(name, 0)), a.sample_tasks, 5)
        bench(url, data, a.runs)


if __name__ == "__main__":
    main()
