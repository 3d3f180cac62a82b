"""`npusim sweep --ray` on a real two-node Ray cluster on 127.0.0.1 (the tiny chip).

Usage: ray_checks.py NPUSIM_BINARY SOURCE_DIR. Prints 'N passed, N failed' and exits non-zero on
any failure. Starts a head (`ray start --head --block`) and one more worker node process, each
with 1 CPU, both at 127.0.0.1 with the dashboard and usage statistics off and a token of the
test's own, and stops both (their process groups) at the end. Checks: the sweep on the cluster
writes the same sweep.csv as the local run (with a point whose process crashes and one whose op
does not exist as error rows) and uses both nodes; a killed driver resumes; a local Ray instance
(`--ray` without an address) runs, and a point that no node can hold is an error row;
`npusim explore --ray` on the cluster gives the trials of a local run with the same seed.
"""
import filecmp
import importlib.util
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from checks_util import TINY_WORKLOADS, check, finish, read_csv, write

NPUSIM, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
PY = sys.executable
RAY_CLI = os.path.join(os.path.dirname(PY), "ray")

# The points run the real npusim through this wrapper: it sleeps 0.3 s per point (so a driver can
# be killed between points) and kills itself with SIGSEGV for the op "Crash" (a crashing point).
WRAPPER = """#!/bin/sh
# `npusim sweep` passes its own path as --npusim: pass this wrapper's instead (the last one counts)
case "$1" in sweep) exec "{npusim}" "$@" --npusim "$0" ;; esac
case " $* " in *" op Crash "*) kill -SEGV $$ ;; esac
case "$1" in op|run) sleep 0.3 ;; esac
exec "{npusim}" "$@"
"""

GRID = """
chip: tiny
grid:
  memory.hbm.gbps: [900, 1800]
  cores.aic.count: [1, 2]
derived:
  cores.aiv.count: 2 * cores.aic.count
workloads:
""" + TINY_WORKLOADS + """  - op: Crash
    inputs: [f16:16]
  - op: NoSuchOp
    inputs: [f16:16]
"""
POINTS = 16

SPACE = """
chip: tiny
space:
  cores.aic.count: {int: [1, 4]}
  memory.hbm.gbps: {choices: [900, 1800, 3600]}
derived:
  cores.aiv.count: 2 * cores.aic.count
objectives: [time_us, cost_usd]
workloads:
  - op: MatMul
    inputs: [f16:128x256, f16:256x256]
search: {sampler: nsga2, trials: 4, population: 4, seed: 2}
"""

# For the local instance (2 CPUs): a point that requests more CPUs than any node has.
GRID_BIG = """
chip: tiny
grid:
  memory.hbm.gbps: [900]
workloads:
  - op: AddV2
    inputs: [f16:64x128, f16:64x128]
  - name: too big
    op: AddV2
    inputs: [f16:16, f16:16]
    resources: {cpus: 64}
"""




def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




class Cluster:
    """A head and one worker node on 127.0.0.1, each `ray start --block` in its own session."""

    def __init__(self, tmp):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
                        RAY_AUTH_TOKEN=secrets.token_hex(32),
                        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
        self.temp = tempfile.mkdtemp(prefix="nr", dir="/tmp")  # short: Ray's socket paths
        self.procs = []
        common = ["--block", "--node-ip-address=127.0.0.1", "--num-cpus=1",
                  "--disable-usage-stats", "--object-store-memory=80000000"]
        self.head_log = os.path.join(tmp, "head.log")
        self._start([RAY_CLI, "start", "--head", f"--port={self.port}", "--include-dashboard=false",
                     f"--temp-dir={self.temp}"] + common, self.head_log)
        self._wait(self.head_log, "Ray runtime started")
        self.worker_log = os.path.join(tmp, "worker.log")
        self._start([PY, os.path.join(ROOT, "tests", "sweep", "ray_worker_node.py"), "start",
                     f"--address={self.address}"] + common, self.worker_log)
        self._wait(self.worker_log, "Ray runtime started")

    def _start(self, cmd, log):
        with open(log, "w") as f:
            self.procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                               env=self.env, start_new_session=True))

    def _wait(self, log, text, timeout=60):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            with open(log) as f:
                if text in f.read():
                    return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        with open(log) as f:
            raise RuntimeError(f"ray node did not start:\n{f.read()[-3000:]}")

    def stop(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3 and any(p.poll() is None for p in self.procs):
            time.sleep(0.2)
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


def sweep(npusim, *args, env=None, expect_rc=0):
    cmd = [npusim, "sweep"] + list(args) + ["--no-plots"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != expect_rc:
        raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}\nstdout:\n{p.stdout}\n"
                             f"stderr:\n{p.stderr}")
    return p


def point_files(out):
    recs = []
    for f in glob.glob(os.path.join(out, "points", "*.json")):
        with open(f) as fh:
            recs.append(json.load(fh))
    return recs


if importlib.util.find_spec("ray") is None:
    print("FAIL ray is not installed in this Python (scripts/setup.sh installs requirements.txt)")
    print("0 passed, 1 failed")
    sys.exit(1)

with tempfile.TemporaryDirectory() as tmp:
    wrapper = write(tmp, "npusim", WRAPPER.format(npusim=NPUSIM), 0o755)
    grid = write(tmp, "grid.yaml", GRID)
    big = write(tmp, "big.yaml", GRID_BIG)
    # npusim sweep execs the script with NPUSIM_PYTHON: the Python that has Ray.
    env = dict(os.environ, NPUSIM_PYTHON=PY)
    local = os.path.join(tmp, "local")
    sweep(wrapper, grid, "--out", local, "--jobs", "2", env=env)
    space = write(tmp, "space.yaml", SPACE)
    explore_local = os.path.join(tmp, "explore_local")
    subprocess.run([NPUSIM, "explore", space, "--out", explore_local, "--no-plots"], check=True,
                   capture_output=True, env=env, timeout=600)
    cluster = Cluster(tmp)
    cenv = dict(cluster.env, NPUSIM_PYTHON=PY)
    try:
        @check("a sweep on a 2-node cluster at 127.0.0.1 gives the local run's sweep.csv; "
               "crashing and failing points are error rows")
        def _():
            out = os.path.join(tmp, "cluster")
            p = sweep(wrapper, grid, "--out", out, "--ray", cluster.address, env=cenv)
            assert "2 node(s), 2 CPUs" in p.stdout, p.stdout
            assert f"{POINTS} to run" in p.stdout and "done: 8 ok, 8 error" in p.stdout, p.stdout
            assert filecmp.cmp(os.path.join(local, "sweep.csv"), os.path.join(out, "sweep.csv"),
                               shallow=False), "sweep.csv differs from the local run's"
            nodes = {r["ray_node"] for r in point_files(out)}
            assert len(nodes) == 2, f"points ran on {len(nodes)} node(s), wanted both"
            eta = [l for l in p.stdout.splitlines() if l.startswith("[")]
            assert len(eta) == POINTS and "eta " in eta[0] and " done " in eta[-1], eta
            rows = read_csv(os.path.join(out, "sweep.csv"))
            for r in rows:
                if r["workload"] == "Crash f16:16":
                    assert r["status"] == "error" and "crashed (SIGSEGV)" in r["reason"], r
                elif r["workload"] == "NoSuchOp f16:16":
                    assert r["status"] == "error" and "NoSuchOp" in r["reason"], r
                else:
                    assert r["status"] == "ok" and float(r["sim_time_us"]) > 0, r

        @check("a killed driver resumes: the stored points are not run again")
        def _():
            out = os.path.join(tmp, "killed")
            cmd = [wrapper, "sweep", grid, "--out", out, "--ray", cluster.address, "--no-plots"]
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env=cenv)
            t0 = time.monotonic()
            while len(glob.glob(os.path.join(out, "points", "*.json"))) < 3:
                assert p.poll() is None, "the driver ended before it could be killed"
                assert time.monotonic() - t0 < 120, "no point finished"
                time.sleep(0.05)
            p.kill()
            p.wait()
            stored = len(glob.glob(os.path.join(out, "points", "*.json")))
            assert stored < POINTS, f"all {stored} points were stored before the kill"
            r = sweep(wrapper, grid, "--out", out, "--ray", cluster.address, env=cenv)
            assert f"{stored} stored, {POINTS - stored} to run" in r.stdout, (stored, r.stdout)
            assert filecmp.cmp(os.path.join(local, "sweep.csv"), os.path.join(out, "sweep.csv"),
                               shallow=False)

        @check("npusim explore --ray on the cluster gives the local run's trials.csv")
        def _():
            out = os.path.join(tmp, "explore_ray")
            p = subprocess.run([NPUSIM, "explore", space, "--out", out, "--no-plots", "--ray",
                                cluster.address], capture_output=True, text=True, env=cenv,
                               timeout=600)
            assert p.returncode == 0 and "2 node(s)" in p.stdout, p.stdout + p.stderr
            assert filecmp.cmp(os.path.join(explore_local, "trials.csv"),
                               os.path.join(out, "trials.csv"), shallow=False)
    finally:
        cluster.stop()

    @check("--ray without an address: a local instance; a point no node can hold is an error row")
    def _():
        out = os.path.join(tmp, "ray_local")
        p = sweep(wrapper, big, "--out", out, "--ray", "--jobs", "2", env=env)
        assert "started a local instance: 1 node(s), 2 CPUs" in p.stdout, p.stdout
        ok, too_big = read_csv(os.path.join(out, "sweep.csv"))
        assert ok["status"] == "ok" and float(ok["sim_time_us"]) > 0, ok
        assert too_big["status"] == "error" and \
            "requests 64 CPUs; the largest node has 2" in too_big["reason"], too_big

finish()
