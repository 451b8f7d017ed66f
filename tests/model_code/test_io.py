"""``model_code/io.py``'s rename that never replaces: the inbox gives a file back its name with it,
so a file another process renamed to that name meanwhile must survive, whoever owns either."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from model_code.io import rename_no_replace
from tests.conftest import REPOSITORY


def test_a_rename_that_never_replaces_moves_to_a_free_name_and_leaves_a_taken_one(tmp_path):
    (tmp_path / "claimed").write_text("the first batch")
    assert rename_no_replace(tmp_path / "claimed", tmp_path / "a.jsonl")
    assert (tmp_path / "a.jsonl").read_text() == "the first batch" and not (tmp_path / "claimed").exists()

    (tmp_path / "claimed").write_text("the first batch again")
    (tmp_path / "b.jsonl").write_text("a newer file under the name")
    assert not rename_no_replace(tmp_path / "claimed", tmp_path / "b.jsonl")
    assert (tmp_path / "b.jsonl").read_text() == "a newer file under the name"  # before a rename replaced it
    assert (tmp_path / "claimed").read_text() == "the first batch again"


@pytest.mark.skipif(os.geteuid() != 0 or Path("/proc/sys/fs/protected_hardlinks").read_text().strip() != "1",
                    reason="needs root (to run a receiver as another user) and fs.protected_hardlinks")
def test_it_renames_a_file_the_receiver_does_not_own():
    """Before: ``_unclaim`` gave the name back with a hard link, which the kernel refuses for a
    file the receiver does not own and may not write (``fs.protected_hardlinks``, the default):
    the file stayed claimed and was taken unsettled. A receiver running as nobody renames root's
    read-only file here."""
    base = Path(tempfile.mkdtemp())  # pytest's tmp_path lies under a folder only root may enter
    os.chmod(base, 0o755)
    inbox = base / "inbox"
    inbox.mkdir()
    os.chown(inbox, 65534, 65534)
    (inbox / "claimed").write_text("dropped by another user")
    os.chmod(inbox / "claimed", 0o444)
    receiver = ("import os, sys; from pathlib import Path; from model_code.io import rename_no_replace; "
                "os.setgid(65534); os.setuid(65534); "  # imported first: nobody may not read this interpreter's files
                "sys.exit(0 if rename_no_replace(Path(sys.argv[1]), Path(sys.argv[2])) else 3)")
    try:
        done = subprocess.run([sys.executable, "-c", receiver, str(inbox / "claimed"), str(inbox / "a.jsonl")],
                              cwd=REPOSITORY, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert (inbox / "a.jsonl").read_text() == "dropped by another user"
    finally:
        shutil.rmtree(base)
