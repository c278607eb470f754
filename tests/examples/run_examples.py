"""Run programs from examples/ one after another in this one interpreter, each as ``__main__``
in a working directory of its own, as a user running them in turn from one Python session would:
the first one's ``sparkdp.session()`` starts Spark and the others reuse it (tests/examples/test_examples.py).

    python tests/examples/run_examples.py '[["fit_arrays.py", "2000", "/tmp/x/fit_arrays"], ...]'

After each program, one line ``RESULT <json>`` with its name, exit status (that of ``sys.exit``;
1 and the traceback for an exception), everything it printed and its wall seconds (``wall_s``,
to find what makes the examples' test long)."""

import contextlib
import io
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
MARK = "RESULT "


def run_one(name: str, rows: str, cwd: str) -> dict:
    printed = io.StringIO()
    status: int | str = 0
    started = time.perf_counter()
    os.environ["SPARKDP_EXAMPLE_ROWS"] = rows  # read when the example's module body runs
    os.chdir(cwd)
    argv = sys.argv
    sys.argv = [str(EXAMPLES_DIR / name)]
    try:
        with contextlib.redirect_stdout(printed):
            runpy.run_path(str(EXAMPLES_DIR / name), run_name="__main__")
    except SystemExit as exc:  # what the interpreter would make of it: None is 0, a message is 1
        status = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would report it
        status = 1
        printed.write(traceback.format_exc())
        traceback.print_exc()
    finally:
        sys.argv = argv
    wall_s = round(time.perf_counter() - started, 2)
    return {"name": name, "returncode": status, "stdout": printed.getvalue(), "wall_s": wall_s}


def main() -> None:
    for name, rows, cwd in json.loads(sys.argv[1]):
        print(MARK + json.dumps(run_one(name, rows, cwd)), flush=True)


if __name__ == "__main__":
    main()
