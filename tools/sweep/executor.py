"""Where the points run: a thread pool of local processes (the default) or Ray tasks.

Both executors take jobs (tag, Context, ResolvedConfig, workload, key) and yield (tag, record) as
the points finish, in any order; the caller stores each record at once (so a killed driver
resumes) and sorts the rows afterwards (so sweep.csv does not depend on the order).

Ray (docs/sweep.md, "Running on Ray"): without an address a local instance is started for the
sweep and shut down after it; with one (`ray start --head` ...) the driver joins that cluster.
Everything binds to the node IP, 127.0.0.1 unless --ray-node-ip says otherwise; the dashboard is
off and usage statistics are off. Every node must see the repository, the npusim binary and the
output folder at the same paths (one host, or a shared file system).
"""
import ipaddress
import os
from concurrent.futures import ThreadPoolExecutor, as_completed

from sweep import runner

TOOLS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LocalExecutor:
    """Points as processes on this host, up to `jobs` at a time."""

    name = "local"

    def __init__(self, jobs):
        self.jobs = jobs

    def run(self, jobs):
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = {pool.submit(runner.run_point, ctx, conf, w, key): tag
                       for tag, ctx, conf, w, key in jobs}
            for f in as_completed(futures):
                yield futures[f], f.result()

    def close(self):
        pass


def _is_loopback(ip):
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


def ray_environment(node_ip, joining):
    """Environment settings that must be in place before `import ray`."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    if _is_loopback(node_ip):
        # Ray replaces a loopback node IP by the host's outward address unless it believes
        # multi-node clusters are off; with this, node, GCS and workers stay on 127.0.0.1.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if joining:
        # `ray start --head` protects its cluster with a token (RAY_AUTH_TOKEN, or the file
        # ~/.ray/auth_token it creates); the driver presents it.
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def _ray_point(ctx, conf, w, key):
    import ray  # noqa: PLC0415
    rec = runner.run_point(ctx, conf, w, key)
    rec["ray_node"] = ray.get_runtime_context().get_node_id()  # where it ran (point file only)
    return rec


class RayExecutor:
    """Points as Ray tasks; each requests the CPUs and memory of its workload (grid `resources`)."""

    name = "ray"

    def __init__(self, address, node_ip="127.0.0.1", local_cpus=None, log=None):
        ray_environment(node_ip, joining=bool(address))
        import ray  # noqa: PLC0415 - optional dependency, imported only with --ray
        self.ray = ray
        common = dict(include_dashboard=False, log_to_driver=False, _node_ip_address=node_ip,
                      runtime_env={"env_vars": {"PYTHONPATH": TOOLS_DIR}},
                      logging_level="WARNING")
        if address:
            ray.init(address=address, **common)
        else:
            # Results are small: a small object store is enough.
            ray.init(num_cpus=local_cpus, object_store_memory=128 << 20, **common)
        self.started_local = not address
        self.remote = ray.remote(max_retries=0)(_ray_point)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        self.largest = {r: max((n["Resources"].get(r, 0) for n in nodes), default=0)
                        for r in ("CPU", "memory")}
        if log:
            cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
            log(f"ray: {'started a local instance' if self.started_local else 'joined ' + address}"
                f": {len(nodes)} node(s), {cpus:g} CPUs")

    def _unschedulable(self, res):
        """Why a request can never be placed on this cluster (else None): Ray would wait for it."""
        if res["cpus"] > self.largest["CPU"]:
            return f"requests {res['cpus']:g} CPUs; the largest node has {self.largest['CPU']:g}"
        if res["memory"] > self.largest["memory"]:
            return (f"requests {res['memory'] / 2**30:.1f} GiB of memory; the largest node has "
                    f"{self.largest['memory'] / 2**30:.1f} GiB")
        return None

    def run(self, jobs):
        ray = self.ray
        pending = {}
        for tag, ctx, conf, w, key in jobs:
            res = w.get("resources") or {"cpus": 1, "memory": 0}
            why = self._unschedulable(res)
            if why:
                yield tag, runner.error_record(conf, w, key, f"ray: {why}")
                continue
            opts = {"num_cpus": res["cpus"]}
            if res["memory"]:
                opts["memory"] = int(res["memory"])
            ref = self.remote.options(**opts).remote(ctx, conf, w, key)
            pending[ref] = (tag, conf, w, key)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                tag, conf, w, key = pending.pop(ref)
                try:
                    rec = ray.get(ref)
                except ray.exceptions.RayError as e:  # the task's worker died, node lost, ...
                    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    rec = runner.error_record(conf, w, key,
                                              f"ray task failed: {type(e).__name__}: {first}"[:400])
                yield tag, rec

    def close(self):
        self.ray.shutdown()


def make_executor(ray_address, jobs, node_ip, log):
    """`ray_address`: None for the local executor, "local" for a local Ray instance, else the
    address of a running cluster."""
    if ray_address is None:
        return LocalExecutor(jobs)
    return RayExecutor(None if ray_address == "local" else ray_address, node_ip, jobs, log)
