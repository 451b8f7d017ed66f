"""A retriever's versions, whatever its kind: the chain of saved versions with its ``CURRENT``
pointer, deltas and periodic whole copies (``chain``), the application of a batch of documents as
the next version (``apply``), and the text of the documents each version holds (``documents``).
The kinds supply what a version contains (``Retriever.add`` / ``remove`` / ``edit``, ``save_delta``);
nothing here knows which kinds exist.
"""
