#!/usr/bin/env python3
"""The bare hand-off through the segment's hostflag words, against a multiprocessing.Pipe, same run.

A thin entry: the code is dspark_proxy/bench/bare.py (`python -m dspark_proxy.bench.bare --help`),
so an installed package has it too.
"""

from __future__ import annotations

import sys

from dspark_proxy.bench.bare import main

if __name__ == "__main__":
    sys.exit(main())
