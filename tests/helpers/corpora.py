"""A BEIR folder laid out as argument-retrieval corpora are."""

import json

TOPICS = {"a": "volcano lava magma eruption crater ash", "b": "violin cello orchestra sonata bow string",
          "c": "glacier ice fjord moraine snow cold"}


def argument_corpus(directory):
    """Each document is also a query (same id, same text) whose answer is the other document of
    its topic: the layout of argument-retrieval and duplicate-question corpora."""
    (directory / "qrels").mkdir(parents=True)
    docs = [{"_id": f"{t}{n}", "title": "", "text": f"{words} {'first view' if n == 1 else 'second view'}"}
            for t, words in TOPICS.items() for n in (1, 2)]
    pairs = [(d["_id"], d["_id"][0] + ("2" if d["_id"][1] == "1" else "1")) for d in docs]
    (directory / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (directory / "queries.jsonl").write_text("".join(json.dumps({"_id": d["_id"], "text": d["text"]}) + "\n" for d in docs))
    for split in ("train", "test"):
        (directory / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in pairs))
    return directory
