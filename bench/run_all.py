"""`make bench`: run every benchmark module in bench/ (each writes bench/results/<name>.json).

From the repository root: ``python -m bench.run_all [--quick]`` (the arguments go to every benchmark).
"""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP = {
    "common",
    "run_all",
    "load",
    "tables",
    "docnumbers",
    "http_load",
    "cpu_serve_users",
}  # helpers, this runner, doc checkers; the load test runs alone; cpu_serve_users needs llama-server
# (make bench-cpu builds it and runs it)

if __name__ == "__main__":
    failed = []
    for script in sorted(HERE.glob("*.py")):
        name = script.stem
        if name in SKIP or name.startswith("_"):
            continue
        print(f"== bench.{name}", flush=True)
        cmd = [sys.executable, "-m", f"bench.{name}", *sys.argv[1:]]
        if subprocess.run(cmd, cwd=HERE.parent).returncode != 0:
            failed.append(name)
    if failed:
        sys.exit(f"benchmarks failed: {failed}")
