"""Batch files as the tests write them: JSON lines, dated back so that the inbox takes them as settled."""

import json
import os
import time


def write_batch(path, docs, age_seconds: float = 10.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    past = time.time() - age_seconds
    os.utime(path, (past, past))
    return path
