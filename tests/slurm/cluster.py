"""A real Slurm cluster of two (or more) nodes on this one machine, for the tests and the bench.

Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` packages (installed with apt-get
when this is root and they are missing), every file in one folder of its own (nothing in /etc):
``slurm.conf`` read through ``-f`` and ``SLURM_CONF``, munged with its own key, socket, pid and log,
and the daemons started in a private mount namespace whose /etc/hosts names the nodes (n1, n2 on
127.0.0.1, each slurmd on its own port). Ports are picked free at the start, and the first job id
at random, so two checkouts' clusters on one machine do not meet (proctrack/cgroup names its
folders by node and job id).

``stop`` ends everything it started, by pid, also after a failure: jobs first (scancel, then the
queue empty), then each slurmd, slurmctld and munged by the pid files they wrote, then the
slurmstepd processes that outlive a SIGKILLed slurmd (found by the mount namespace they share with
the daemons), then the cgroup folders of this cluster's jobs, then the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
PROGRAMS = ("slurmctld", "slurmd", "sbatch", "munged")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PARTITION = "debug"
KEEP_LOGS_ENV = "DDPTUI_TEST_SLURM_LOGS"  # a folder: stop copies the daemons' logs there first
# Seconds Slurm gives a node to answer before it is "not responding", then DOWN (NODE_FAIL for its
# jobs): short, so the node-failure test ends in seconds; long enough for a busy 2-core machine.
SLURMD_TIMEOUT = 10
KILL_WAIT = 5  # seconds between SIGTERM and SIGKILL when Slurm ends a job


class ClusterUnavailable(Exception):
    """The cluster cannot be set up on this machine; the message says why (a test skips on it)."""


def _which(program: str) -> str | None:
    return shutil.which(program) or next(
        (f"{d}/{program}" for d in SBIN if os.access(f"{d}/{program}", os.X_OK)), None
    )


def ensure_packages() -> None:
    """Slurm and munge are here, or installed now (root with apt-get); ClusterUnavailable else."""
    if all(_which(p) for p in PROGRAMS):
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable("Slurm is not installed and only root may install it (apt-get)")
    if not _which("apt-get"):
        raise ClusterUnavailable("Slurm is not installed and this machine has no apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
    ):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            raise ClusterUnavailable(f"{' '.join(command[:2])} failed: {' '.join(tail)}")
    missing = [p for p in PROGRAMS if not _which(p)]
    if missing:
        raise ClusterUnavailable(f"installed {', '.join(PACKAGES)} but {missing} are missing")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _end_pid(pid: int, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace``; waits until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + grace
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


@dataclass
class SlurmTestCluster:
    """One test cluster. ``start()`` brings it up (ClusterUnavailable when it cannot); ``stop()``
    ends all of it, whatever state it is in."""

    nodes: tuple[str, ...] = ("n1", "n2")
    cpus_per_node: int = 2
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ddptui-slurm-")))
    ports: dict[str, int] = field(default_factory=dict)
    first_job_id: int = field(default_factory=lambda: random.randrange(10_000, 60_000_000))
    namespace: str = ""  # the mount namespace of the daemons, as /proc/PID/ns/mnt reads it
    # Jobs a test module keeps running across its tests (one that must outlast a time limit):
    # ``cancel_all(keep=...)`` between tests leaves them.
    kept_jobs: set[str] = field(default_factory=set)

    # -- paths ---------------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    def log(self, daemon: str) -> Path:
        return self.root / "log" / f"{daemon}.log"

    def pid_file(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"

    def env(self) -> dict[str, str]:
        """What a client of this cluster needs in its environment (sbatch, squeue, ddptui)."""
        return {"SLURM_CONF": str(self.conf)}

    # -- writing the configuration ---------------------------------------------------------------
    def _write_files(self) -> None:
        self.root.chmod(0o755)  # munged (user munge) reaches its folder through this one
        for sub in ("etc", "log", "run", "state", "spool", "munge"):
            (self.root / sub).mkdir(mode=0o755, exist_ok=True)
        host = socket.gethostname().split(".")[0]
        self.ports = {"slurmctld": free_port(), **{n: free_port() for n in self.nodes}}
        lines = [
            f"ClusterName=ddptui{self.first_job_id}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ports['slurmctld']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.pid_file('slurmctld')}",
            f"SlurmdPidFile={self.root / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.log('slurmctld')}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd-%n.log'}",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "TaskPlugin=task/none",
            "ProctrackType=proctrack/cgroup",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobRequeue=0",
            f"KillWait={KILL_WAIT}",
            f"SlurmdTimeout={SLURMD_TIMEOUT}",
            "MinJobAge=300",
            f"FirstJobId={self.first_job_id}",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.root / 'state' / 'jobcomp.txt'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=debug",  # what a node told slurmctld of a job's end (job_end_told)
        ]
        for node in self.nodes:
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 "
                f"Port={self.ports[node]} CPUs={self.cpus_per_node} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP"
        )
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "etc" / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nConstrainCores=no\nConstrainRAMSpace=no\n"
        )
        hosts = Path("/etc/hosts").read_text(errors="replace")
        (self.root / "etc" / "hosts").write_text(
            hosts.rstrip("\n") + f"\n127.0.0.1 {' '.join(self.nodes)}\n"
        )
        munge = pwd.getpwnam("munge")
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for path in (self.root / "munge", key):
            os.chown(path, munge.pw_uid, munge.pw_gid)

    # -- starting -------------------------------------------------------------------------------
    def _daemon_env(self) -> dict[str, str]:
        # A clean environment: the daemons must not carry a test's process marker (the test's
        # reaper would end them as its leftovers), nor the runner's Python settings.
        return {"PATH": ":".join(SBIN), "SLURM_CONF": str(self.conf), "LANG": "C.UTF-8"}

    def _munged_command(self) -> list[str]:
        m = self.root / "munge"
        return [
            "runuser", "-u", "munge", "--", _which("munged") or "munged",
            f"--socket={self.munge_socket}", f"--key-file={m / 'munge.key'}",
            f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
            f"--seed-file={m / 'munged.seed'}", "--num-threads=2",
        ]  # fmt: skip

    def _slurmd_command(self, node: str) -> list[str]:
        return [_which("slurmd") or "slurmd", "-f", str(self.conf), "-N", node]

    def _in_namespace(self, commands: list[list[str]]) -> None:
        """Run ``commands`` (daemons that fork away) in the cluster's mount namespace: a new one
        with the cluster's hosts file, or (once made) the same one entered again."""
        script = " && ".join(" ".join(_quote(a) for a in c) for c in commands)
        if self.namespace:
            holder = self._namespace_holder()
            if holder is None:
                raise ClusterUnavailable("no daemon of the cluster is left to enter its namespace")
            argv = ["nsenter", f"--mount=/proc/{holder}/ns/mnt", "sh", "-c", script]
        else:
            hosts = self.root / "etc" / "hosts"
            script = f"mount --bind {_quote(str(hosts))} /etc/hosts && {script}"
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
        done = subprocess.run(
            argv, env=self._daemon_env(), capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if done.returncode != 0:
            raise ClusterUnavailable(
                f"starting the daemons failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-400:]}"
            )

    def _namespace_holder(self) -> int | None:
        for daemon in ("slurmctld", *(f"slurmd-{n}" for n in self.nodes)):
            pid = _read_pid(self.pid_file(daemon))
            if pid and _alive(pid):
                return pid
        return None

    def start(self, timeout: float = 60.0) -> None:
        ensure_packages()
        if os.geteuid() != 0:
            raise ClusterUnavailable("a test Slurm cluster needs root (slurmd runs jobs as root)")
        if not (CGROUP_ROOT / "freezer").is_dir():
            raise ClusterUnavailable("proctrack/cgroup needs the cgroup v1 freezer; none here")
        self._write_files()
        try:
            self._in_namespace(
                [
                    self._munged_command(),
                    [_which("slurmctld") or "slurmctld", "-f", str(self.conf)],
                    *(self._slurmd_command(n) for n in self.nodes),
                ]
            )
            holder = self._namespace_holder()
            if holder is not None:
                self.namespace = os.readlink(f"/proc/{holder}/ns/mnt")
            self.wait_nodes_idle(timeout)
        except BaseException:
            self.stop()
            raise

    def start_slurmd(self, node: str, timeout: float = 60.0) -> None:
        """Start ``node``'s slurmd again (after ``kill_slurmd``) and wait until it takes jobs."""
        self._in_namespace([self._slurmd_command(node)])
        self.wait_nodes_idle(timeout)

    def kill_slurmd(self, node: str) -> int:
        """SIGKILL ``node``'s slurmd, as a crashed node: its pid. Its slurmstepd live on."""
        pid = _read_pid(self.root / "run" / f"slurmd-{node}.pid")
        assert pid is not None and _alive(pid), f"slurmd of {node} is not running"
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.05)
        return pid

    # -- asking it ------------------------------------------------------------------------------
    def run(self, *command: str, timeout: float = 30.0, check: bool = True) -> str:
        done = subprocess.run(
            list(command), env={**os.environ, **self.env()}, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo says it (idle, mixed, allocated, down*, ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_nodes_idle(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(states.get(n) == "idle" for n in self.nodes):
                return
            time.sleep(0.2)
        raise ClusterUnavailable(f"the nodes did not become idle within {timeout:g} s: {states}")

    def jobs(self) -> list[dict[str, object]]:
        """Every job squeue knows (finished ones within MinJobAge too)."""
        out = self.run("squeue", "--json", check=False)
        try:
            data = json.loads(out)
        except json.JSONDecodeError:
            return []
        return list(data.get("jobs") or [])

    def active_jobs(self) -> list[str]:
        live = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")
        return [str(j.get("job_id")) for j in self.jobs() if j.get("job_state") in live]

    def cancel_all(self, timeout: float = 30.0, keep: set[str] | None = None) -> None:
        """scancel every job of this cluster (but ``keep``) and wait until none is active."""
        keep = keep or set()
        jobs = [j for j in self.active_jobs() if j not in keep]
        if jobs:
            self.run("scancel", *jobs, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and set(self.active_jobs()) - keep:
            time.sleep(0.2)

    # -- stopping -------------------------------------------------------------------------------
    def stray_processes(self) -> list[int]:
        """Processes in the daemons' mount namespace: the daemons and every slurmstepd (with the
        job processes they hold), this cluster's and no other's."""
        if not self.namespace:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if os.readlink(entry / "ns" / "mnt") == self.namespace:
                    found.append(int(entry.name))
            except OSError:
                continue
        own_namespace = os.readlink("/proc/self/ns/mnt")
        return [] if self.namespace == own_namespace else found

    def job_end_told(self, job_id: str, node: str) -> bool:
        """Whether ``node``'s slurmd told slurmctld that job ``job_id`` ended there (its epilog
        complete message, which its debug log notes). A node whose slurmd was killed tells it
        only once its slurmd is back and the job's leftover steps ended; a requeued job let go
        before that would have slurmctld take the message for its next run's end on the node,
        and that run's steps never start ("Requested nodes are busy")."""
        log = self.root / "log" / f"slurmd-{node}.log"
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            return False
        return any("sent epilog complete msg" in line and job_id in line for line in lines)

    def job_processes(self, job_id: str, node: str) -> list[int]:
        """The processes of job ``job_id`` left on ``node`` (its slurmstepd and what they run),
        by the freezer cgroup proctrack/cgroup put them in. A node whose slurmd was killed keeps
        them until they end; a job Slurm requeued must not start there before (Slurm holds it
        two minutes for that)."""
        found = []
        for pid in self.stray_processes():
            try:
                groups = Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                continue
            if f"freezer:/slurm_{node}/" in groups and f"/job_{job_id}" in groups:
                found.append(pid)
        return found

    def stop(self) -> None:
        """End everything of the cluster, by pid; safe to call twice and after a failed start."""
        holder = self._namespace_holder()
        if holder is not None and _alive(holder):
            with contextlib.suppress(Exception):
                self.cancel_all()
        for node in self.nodes:
            pid = _read_pid(self.root / "run" / f"slurmd-{node}.pid")
            if pid:
                _end_pid(pid)
        for pid_file in (self.pid_file("slurmctld"), self.root / "munge" / "munged.pid"):
            pid = _read_pid(pid_file)
            if pid:
                _end_pid(pid)
        for pid in self.stray_processes():  # slurmstepd that outlived its slurmd, their jobs
            _end_pid(pid, grace=2.0)
        self._remove_cgroups()
        keep = os.environ.get(KEEP_LOGS_ENV)
        if keep and (self.root / "log").is_dir():  # the daemons' logs, for a failure to be read
            shutil.copytree(self.root / "log", Path(keep) / self.root.name, dirs_exist_ok=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def _remove_cgroups(self) -> None:
        """The folders proctrack/cgroup made for this cluster's jobs (deepest first), then the
        node folders when no other cluster's jobs are in them."""
        for controller in ("freezer", "cpuset", "memory", "devices", "cpuacct"):
            for node in self.nodes:
                top = CGROUP_ROOT / controller / f"slurm_{node}"
                if not top.is_dir():
                    continue
                ours = [
                    p
                    for p in top.glob("uid_*/job_*")
                    if p.name.removeprefix("job_").isdigit()
                    and int(p.name.removeprefix("job_")) >= self.first_job_id
                    and int(p.name.removeprefix("job_")) < self.first_job_id + 100_000
                ]
                for job in ours:
                    for sub in sorted(job.rglob("*"), key=lambda p: -len(p.parts)):
                        if sub.is_dir():
                            with contextlib.suppress(OSError):
                                sub.rmdir()
                    with contextlib.suppress(OSError):
                        job.rmdir()
                for leftover in (*top.glob("uid_*"), *top.glob("system"), top):
                    with contextlib.suppress(OSError):
                        leftover.rmdir()  # refused while another cluster's job is inside


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
