"""Run the memrl CLI under a storage limit and report what it left behind (tests/test_runtime_faults.py).

``python limited_run.py [--fsize BYTES] [--mount-tmpfs DIR --size SIZE] --list DIR -- memrl-args...``: with
``--fsize`` the process's file-size limit (RLIMIT_FSIZE, ``ulimit -f``) is set first; with ``--mount-tmpfs`` the
script expects to run inside a private mount namespace (``unshare -rm``) and mounts a tmpfs of SIZE on DIR, so the
run meets a real "no space left on device". After the CLI returns, one last stdout line ``LEFT {json}`` lists every
path under ``--list`` (relative) with its size: the tmpfs vanishes with the namespace, so the test reads it here.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fsize", type=int, default=None)
    parser.add_argument("--mount-tmpfs", default=None)
    parser.add_argument("--size", default="4m")
    parser.add_argument("--list", required=True)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.mount_tmpfs:
        Path(args.mount_tmpfs).mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.size}", "tmpfs", args.mount_tmpfs], check=True)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if args.fsize is not None:  # the soft limit: the listing below raises it back
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize, hard))
    from memrl.launch.cli import main as memrl_main

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    code = memrl_main(argv)
    sys.stderr.flush()
    if args.fsize is not None:  # listing is small, but leave the limit out of it
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    root = Path(args.list)
    left = (
        {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else -1) for p in sorted(root.rglob("*"))}
        if root.is_dir()
        else {}
    )
    print("LEFT " + json.dumps(left), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
