"""Servers stop when asked, whatever their parent ignored.

A signal a process ignores stays ignored across fork and exec. A job in a non-interactive shell
ignores SIGINT and SIGQUIT, ``nohup`` adds SIGHUP, and in the full test run a worker was found
ignoring SIGTERM: every server started under it (Milvus Lite, ``mlflow models serve``) then
outlived its ``terminate`` and kept its port. The services this project starts and stops by pid
therefore begin with the stop signals at their defaults.
"""

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def default_stop_signals() -> None:
    """Put the stop signals back to their default action (use as ``preexec_fn``, or before exec)."""
    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_DFL)
