"""Print the pipeline's headline results (``python -m model_code.report [ROOT]``)."""

from __future__ import annotations

import json
import sys

from model_code.layout import Layout


def render(layout: Layout) -> str:
    metrics_file = layout.eval_report / "metrics.json"
    if not metrics_file.exists():
        return f"no evaluation results yet under {layout.root} (run the pipeline first)"
    metrics = json.loads(metrics_file.read_text())
    lines = [f"Retrieval quality on the {metrics['split']} split ({metrics['queries']} queries):", ""]
    lines += ["| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" for k, v in metrics.items() if "@" in k]
    registration = layout.registry_report / "registration.json"
    if registration.exists():
        reg = json.loads(registration.read_text())
        lines += ["", f"Registered {reg['model_uri']} as @{reg['alias']} ({reg['reason']})"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(Layout(sys.argv[1] if len(sys.argv) > 1 else ".")))
