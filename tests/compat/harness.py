"""What the compat scripts that start their own controllers share: failing a step, waiting on
an observable condition, and starting processes that the script stops at its end (`PROCS`)."""

import os
import subprocess
import time

PROCS = []


def fail(msg):
    raise AssertionError(msg)


def wait_until(what, fn, timeout=120.0, interval=0.3):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # a controller still starting
            last = e
        time.sleep(interval)
    fail(f"timed out waiting for {what} (last error: {last})")


def spawn(args, log, env=None, cwd=None):
    """Starts `args` in its own session (so its whole group can be signalled), output to `log`."""
    p = subprocess.Popen(
        args,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )
    PROCS.append(p)
    return p
