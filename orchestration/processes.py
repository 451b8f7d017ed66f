"""Whether a pid read from a pid file is still the process that was started there.

The stack's services and the Milvus servers are stopped by pid. A pid file can outlive its process
(a reboot, a ``kill -9``), and its pid can then belong to another program, or to another data
directory's server, which must be neither signalled nor reported as the service: a pid counts only
while the process runs and its command line names what was started.
"""

from __future__ import annotations

import os

import psutil


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a child of this process that exited is reaped (a zombie would still
    answer ``kill 0``)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:  # not our child: another process started it (make milvus-up, make stack)
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def runs(pid: int, *markers: str) -> bool:
    """Whether ``pid`` runs and its command line holds every one of ``markers``: a process that
    exited, another user's that cannot be read, or one of another program is not the one started."""
    if not alive(pid):
        return False
    try:
        command = " ".join(psutil.Process(pid).cmdline())  # a zombie's is empty
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return all(marker in command for marker in markers)
