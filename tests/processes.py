"""Processes read from /proc, for the tests that stop a command and check what it leaves running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def live_processes(*, parent: int | None = None, group: int | None = None) -> list[int]:
    """The processes (zombies excepted) whose parent is ``parent``, or whose process group is ``group``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # it exited while we looked
            continue
        if fields[0] != "Z" and (int(fields[1]) == parent or int(fields[2]) == group):
            found.append(int(stat.parent.name))
    return found


def outliving(pids: list[int], wait_s: float = 5.0) -> list[int]:
    """Those of ``pids`` still running (zombies excepted) after up to ``wait_s`` seconds: a process killed as
    its parent exits is gone once the kernel has torn it down, which a loaded machine may take a moment to do."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
            except OSError:  # gone
                continue
            if state != "Z":
                alive.append(pid)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def terminate_once_ranks_run(
    args: list[str], ranks: int, marker: bytes, env: dict | None = None
) -> tuple[int, str, list[int]]:
    """Run ``python -m placer ARGS``, wait until it has ``ranks`` child processes, and SIGTERM placer
    alone (`kill PID`: `timeout` signals the group too). Returns its exit status, its stderr and the
    children's ids; children left running whose command line holds ``marker`` are killed after."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "placer", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    children: list[int] = []
    try:
        for _ in range(1200):  # until every rank has started (placer imports first)
            children = live_processes(parent=launcher.pid)
            if len(children) == ranks or launcher.poll() is not None:
                break
            time.sleep(0.1)
        assert len(children) == ranks, "the ranks did not start"
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=30)
        return launcher.returncode, err, children
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in children:
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=15)
