"""Check that a named test fails on a named mutant: the tests added for earlier survivors
(``survivors.KILLED_BY``) are each run alone against the mutant they were written for, in the
scratch copy mutmut has just run in (``run.py`` calls this before removing it).

    python killers.py MUTANTS_DIR '[["mutant name", "tests/model_code/x/test_y.py::test_z"], ...]'

Prints a JSON object: mutant name -> true when that test failed with the mutant active and
passes without it. One process imports the tests once and forks per run, as mutmut's fork server
does.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    directory, pairs = sys.argv[1], json.loads(sys.argv[2])
    os.chdir(directory)
    sys.path.insert(0, os.getcwd())
    import pytest

    files = sorted({test.split("::")[0] for _, test in pairs})
    os.environ["MUTANT_UNDER_TEST"] = ""
    pytest.main(["--rootdir=.", "-qqq", "--collect-only", "-p", "no:unraisableexception", *files])

    def exit_code(mutant: str, test: str) -> int:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            os.environ["MUTANT_UNDER_TEST"] = mutant
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            code = pytest.main(["--rootdir=.", "-x", "-q", "-p", "no:randomly", "-p", "no:unraisableexception", test])
            os._exit(int(code))
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    passes = {test: exit_code("", test) == 0 for test in {test for _, test in pairs}}
    print("KILLERS " + json.dumps({name: passes[test] and exit_code(name, test) != 0 for name, test in pairs}))


if __name__ == "__main__":
    main()
