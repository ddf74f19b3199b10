"""`make bench`: run every benchmark script in bench/ (each writes bench/results/<name>.json)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP = {"common.py", "run_all.py", "load.py"}

if __name__ == "__main__":
    failed = []
    for script in sorted(HERE.glob("*.py")):
        if script.name in SKIP or script.name.startswith("_"):
            continue
        print(f"== {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script), *sys.argv[1:]]).returncode != 0:
            failed.append(script.name)
    if failed:
        sys.exit(f"benchmarks failed: {failed}")
