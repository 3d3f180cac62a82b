"""Starts one more Ray worker node on this host at 127.0.0.1: `ray start --address ... --block`
with two checks of the Ray CLI relaxed, for the sweep's Ray test (tests/sweep/ray_checks.py).

Stock Ray refuses a loopback node IP for a node that joins a cluster: `ray start` replaces
127.0.0.1 by the host's outward address (services.resolve_ip_for_localhost), and with that
replacement turned off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) it refuses to start a worker node
at all. The test's two nodes must stay on 127.0.0.1, so this keeps the address as given and
allows the worker node; everything else is `ray start`.
Usage: python ray_worker_node.py start --address=127.0.0.1:PORT --node-ip-address=127.0.0.1 ...
"""
import sys

import ray._private.ray_constants as ray_constants
import ray._private.services as services

ray_constants.ENABLE_RAY_CLUSTER = True
services.resolve_ip_for_localhost = lambda host: host

from ray.scripts.scripts import main  # noqa: E402

sys.argv = ["ray"] + sys.argv[1:]
sys.exit(main())
