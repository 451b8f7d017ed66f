"""Imported by the fork server when the run-launcher test names it in ``preload_modules``: it
records the process that imported it, which a run worker then reads."""

import os

IMPORTED_BY = os.getpid()
