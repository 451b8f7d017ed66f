"""Waiting on another process (a daemon, a run worker, a server) without sleeping a fixed time."""

import time
from collections.abc import Callable

import pytest


def wait_until(condition: Callable, what: str, seconds: float, interval: float = 0.2,
               diagnose: Callable[[], str] | None = None):
    """``condition()``'s first truthy value, polled every ``interval`` s; a test failure naming
    ``what`` (and ``diagnose()``'s account of the other processes) after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {seconds} s waiting for {what}" + (f"\n{diagnose()}" if diagnose else ""))
