"""``python -m runners.harness JOB.json``: run one job in the sandbox and print
its result as one JSON object.

This process is the supervisor: the kernel runs in a sandboxed child, so a
crash or a hang still ends in a result and exit status 0. Only a job that
cannot be run as written (malformed), or a usage error, exits non-zero, with
one line on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from runners.harness.children import REPO_ROOT
from runners.harness.job import MAX_TIMEOUT_S, MalformedJob, load_job
from runners.harness.sandbox import DEFAULT_TIMEOUT_S, run_job


def default_cache_dir(interpreter: str) -> str:
    """A persistent kernel cache per toolchain interpreter. The path is not
    resolved: venv interpreters are symlinks to one base Python."""
    key = hashlib.sha256(os.path.abspath(interpreter).encode()).hexdigest()[:12]
    base = os.environ.get("TM_HARNESS_CACHE_DIR") or os.path.join(
        REPO_ROOT, "var", "harness-cache"
    )
    return os.path.join(base, key)


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line, as every other refusal of this command."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def timeout_seconds(text: str) -> float:
    """A --timeout: NaN, infinity or no time at all cannot bound a job."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < seconds <= MAX_TIMEOUT_S:  # false for NaN too
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}"
        )
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="python -m runners.harness")
    parser.add_argument("job", help="job JSON file, or - for standard input")
    parser.add_argument(
        "--interpreter",
        default=sys.executable,
        help="Python of the toolchain to validate with",
    )
    parser.add_argument("--cache-dir", help="persistent TileLang kernel cache")
    parser.add_argument("--timeout", type=timeout_seconds, default=DEFAULT_TIMEOUT_S)
    parser.add_argument(
        "--untrusted",
        action="store_true",
        help="throwaway kernel cache (implied by a job with source)",
    )
    args = parser.parse_args(argv)
    if not os.path.exists(args.interpreter):
        return _refuse(f"no interpreter at {args.interpreter}")
    try:
        text = sys.stdin.read() if args.job == "-" else Path(args.job).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return _refuse(f"cannot read job {args.job}: {exc}")
    try:
        result = run_job(
            load_job(text),
            interpreter=args.interpreter,
            cache_dir=args.cache_dir or default_cache_dir(args.interpreter),
            timeout_s=args.timeout,
            trusted=not args.untrusted,
        )
    except MalformedJob as exc:
        return _refuse(f"malformed job: {exc}")
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


def _refuse(message: str) -> int:
    print(" ".join(message.split()), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
