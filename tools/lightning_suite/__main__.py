"""``python -m tools.lightning_suite``: run Lightning's test suite against geartrain, or report a run.

    python -m tools.lightning_suite run --lightning CHECKOUT --out OUT [--part trainer --part callbacks]
    python -m tools.lightning_suite report --out OUT

``run`` must be started with the interpreter of the scratch environment (geartrain and Lightning's
test requirements installed; docs/testing.md says how to make it); ``report`` needs only this
repository.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.lightning_suite import report, run


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run or report."""
    parser = argparse.ArgumentParser(prog="python -m tools.lightning_suite", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="run the in-scope test files part by part, then report")
    go.add_argument("--lightning", type=Path, required=True, help="a checkout of Lightning's sources (tag 2.6.x)")
    go.add_argument("--out", type=Path, required=True, help="where outcomes and tables go")
    go.add_argument("--work", type=Path, help="the scratch folder (default: OUT/work)")
    go.add_argument("--part", action="append", help="a top-level folder or file of tests_pytorch (repeatable)")
    go.add_argument("--file", action="append", help="only test files whose path contains this (repeatable)")
    go.add_argument("--timeout", type=int, default=60, help="seconds one test may take (default 60)")
    go.add_argument("--part-timeout", type=int, default=3600, help="seconds one part may take (default 3600)")
    go.add_argument("-n", "--workers", type=int, default=0, help="pytest-xdist workers per part (default 0)")
    go.add_argument("--nice", type=int, default=19, help="niceness of the test processes (default 19)")
    go.add_argument("--keep", action="store_true", help="keep the outcomes of parts run before (resume a run)")
    show = sub.add_parser("report", help="classify the outcomes in OUT and write the tables")
    show.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        settings = run.Settings(
            checkout=args.lightning.resolve(),
            work=(args.work or args.out / "work").resolve(),
            test_timeout=args.timeout,
            part_timeout=args.part_timeout,
            workers=args.workers,
            nice=args.nice,
        )
        run.run(settings, args.out.resolve(), args.part, fresh=not args.keep, files=args.file)
    print(report.write(args.out.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
