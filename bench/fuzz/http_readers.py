"""Fuzz gorge's HTTP readers for a bounded time: the suite's fuzz properties
(tests/web/test_request_fuzz.py, tests/client/test_response_fuzz.py and the
hot channel's byte-for-byte test) run by pytest again and again, each round
with a fresh seed and ``--scale`` times the suite's examples, until the time
is up.

A failure prints hypothesis's smallest input and the seed, and ends the run
with pytest's status.

Usage: python bench/fuzz/http_readers.py [--seconds 300] [--scale 10]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROPERTIES = [
    "tests/web/test_request_fuzz.py",
    "tests/client/test_response_fuzz.py",
    "tests/web/test_hotchannel.py::test_every_answer_is_the_twisted_web_answer_to_the_byte",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--scale", type=int, default=10)
    args = parser.parse_args()
    env = dict(os.environ, HTTP_FUZZ_SCALE=str(args.scale))
    until = time.monotonic() + args.seconds
    rounds = 0
    while time.monotonic() < until:
        seed = random.getrandbits(32)
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        argv += [f"--hypothesis-seed={seed}", *PROPERTIES]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-6000:])
            print(f"failed with --hypothesis-seed={seed} HTTP_FUZZ_SCALE={args.scale}")
            return done.returncode
        rounds += 1
    print(f"{rounds} rounds at {args.scale} times the suite's examples, no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
