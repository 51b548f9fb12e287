"""What this process may use of the machine (``engine.core.host.capacity``) and its memory cgroup
(``engine.core.host.cgroups``), read from cgroup files the tests write under tmp_path, so the
figures hold on any machine; the usable cores from a real affinity mask in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from engine.core.host.capacity import available_memory_bytes, usable_cores
from engine.core.host.cgroups import (
    MemoryCgroup,
    cgroup_oom_kills,
    memory_cgroup,
    memory_headroom,
    own_memory_cgroup,
)
from tests.fixtures.repo import REPO_ROOT

GIB = 1024**3
UNLIMITED_V1 = "9223372036854771712\n"


def write_files(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def headroom(root: Path) -> int | None:
    cgroup = memory_cgroup(root=root / "cg", proc_cgroup=root / "proc")
    return memory_headroom(cgroup) if cgroup is not None else None


# ---- where the memory cgroup is -----------------------------------------------------------------


def test_the_v1_memory_hierarchy_wins_over_the_unified_one(tmp_path: Path) -> None:
    write_files(tmp_path, {"proc": "9:name=systemd:/\n4:cpu,memory:/process_api/abc\n0::/\n"})
    cgroup = memory_cgroup(root=tmp_path / "cg", proc_cgroup=tmp_path / "proc")
    assert cgroup == MemoryCgroup(version=1, mount=tmp_path / "cg/memory", path="/process_api/abc")
    assert cgroup.directory == tmp_path / "cg/memory/process_api/abc"
    assert cgroup.lineage() == [
        tmp_path / "cg/memory/process_api/abc",
        tmp_path / "cg/memory/process_api",
        tmp_path / "cg/memory",
    ]
    assert (cgroup.limit_file, cgroup.usage_file) == (
        "memory.limit_in_bytes",
        "memory.usage_in_bytes",
    )


def test_v2_is_found_at_the_root_or_under_unified_on_a_hybrid_machine(tmp_path: Path) -> None:
    write_files(
        tmp_path, {"proc": "0::/user.slice/app.scope\n", "cg/cgroup.controllers": "memory\n"}
    )
    v2 = memory_cgroup(root=tmp_path / "cg", proc_cgroup=tmp_path / "proc")
    assert v2 is not None and v2.version == 2
    assert v2.directory == tmp_path / "cg/user.slice/app.scope"
    assert (v2.limit_file, v2.usage_file) == ("memory.max", "memory.current")

    write_files(
        tmp_path / "hybrid",
        {"proc": "1:name=systemd:/\n0::/job\n", "cg/unified/cgroup.controllers": "\n"},
    )
    hybrid = memory_cgroup(root=tmp_path / "hybrid/cg", proc_cgroup=tmp_path / "hybrid/proc")
    assert hybrid is not None and hybrid.directory == tmp_path / "hybrid/cg/unified/job"


def test_no_memory_cgroup_named_or_no_file_is_none(tmp_path: Path) -> None:
    write_files(tmp_path, {"proc": "9:name=systemd:/\n3:cpuset:/\nnot a cgroup line\n"})
    assert memory_cgroup(root=tmp_path, proc_cgroup=tmp_path / "proc") is None
    assert memory_cgroup(root=tmp_path, proc_cgroup=tmp_path / "missing") is None
    assert own_memory_cgroup(pid=2**22 + 12345) is None  # no such process


def test_this_process_s_own_memory_cgroup_is_what_proc_says() -> None:
    text = Path("/proc/self/cgroup").read_text()
    listed = [line.split(":", 2) for line in text.splitlines()]
    v1 = [path for _, controllers, path in listed if "memory" in controllers.split(",")]
    found = own_memory_cgroup()
    if v1:
        assert found == Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/")
    else:
        assert found is None or str(found).startswith("/sys/fs/cgroup")


# ---- the room its limits leave --------------------------------------------------------------------


def test_cgroup_v1_limit_minus_usage_less_reclaimable_cache(tmp_path: Path) -> None:
    write_files(
        tmp_path,
        {
            "proc": "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n",
            "cg/memory/process_api/abc/memory.limit_in_bytes": f"{8 * GIB}\n",
            "cg/memory/process_api/abc/memory.usage_in_bytes": f"{3 * GIB}\n",
            "cg/memory/process_api/abc/memory.stat": f"cache 5\ntotal_inactive_file {GIB}\n",
            "cg/memory/memory.limit_in_bytes": UNLIMITED_V1,
        },
    )
    assert headroom(tmp_path) == 6 * GIB


def test_cgroup_an_ancestor_limit_counts_and_unlimited_is_none(tmp_path: Path) -> None:
    files = {
        "proc": "4:memory:/process_api/abc\n",
        "cg/memory/process_api/abc/memory.limit_in_bytes": UNLIMITED_V1,
        "cg/memory/process_api/abc/memory.usage_in_bytes": f"{GIB}\n",
    }
    write_files(tmp_path, files)
    assert headroom(tmp_path) is None
    write_files(
        tmp_path,
        {
            "cg/memory/process_api/memory.limit_in_bytes": f"{5 * GIB}\n",
            "cg/memory/process_api/memory.usage_in_bytes": f"{2 * GIB}\n",
        },
    )
    assert headroom(tmp_path) == 3 * GIB


def test_cgroup_v2_and_a_container_that_sees_its_cgroup_as_the_root(tmp_path: Path) -> None:
    write_files(
        tmp_path,
        {
            "proc": "0::/user.slice/app.scope\n",
            "cg/user.slice/app.scope/memory.max": "max\n",
            "cg/user.slice/app.scope/memory.current": f"{GIB}\n",
            "cg/user.slice/memory.max": f"{4 * GIB}\n",
            "cg/user.slice/memory.current": f"{2 * GIB}\n",
            "cg/user.slice/memory.stat": f"anon 1\ninactive_file {GIB // 2}\n",
        },
    )
    assert headroom(tmp_path) == 4 * GIB - 3 * GIB // 2
    # Docker without a cgroup namespace: /proc says /docker/<id>, the mount shows only its root.
    write_files(
        tmp_path / "docker",
        {
            "proc": "0::/docker/0123abcd\n",
            "cg/memory.max": f"{2 * GIB}\n",
            "cg/memory.current": f"{GIB}\n",
        },
    )
    assert headroom(tmp_path / "docker") == GIB
    assert headroom(tmp_path / "none") is None


def test_available_memory_is_the_smaller_of_the_kernel_and_the_cgroup(tmp_path: Path) -> None:
    write_files(
        tmp_path,
        {
            "proc": "0::/job\n",
            "cg/job/memory.max": f"{GIB}\n",
            "cg/job/memory.current": f"{GIB // 4}\n",
        },
    )
    assert available_memory_bytes(tmp_path / "cg", tmp_path / "proc") == 3 * GIB // 4
    unlimited = available_memory_bytes(tmp_path / "none", tmp_path / "missing")
    assert 0 < unlimited <= psutil.virtual_memory().total
    assert 0 < available_memory_bytes() <= psutil.virtual_memory().total


# ---- out-of-memory kills ------------------------------------------------------------------------


def test_the_oom_kill_count_is_read_from_the_cgroups_own_files(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir()
    v1.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 7\n")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert cgroup_oom_kills(v2) == 7
    assert cgroup_oom_kills(v1) == 5
    assert cgroup_oom_kills(tmp_path / "missing") is None


# ---- usable cores -------------------------------------------------------------------------------

AFFINITY_PROBE = """
import json, os, sys
from pathlib import Path
from engine.core.config.presets import load_preset
from engine.core.plan.run_plan import plan_run
from engine.core.runs.rundir import RunDir
from engine.core.common.run_environment import THREADS_ENV
from engine.core.host.capacity import usable_cores
from engine.train.launch import rank_environment

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
plan = plan_run(load_preset("cpu-demo"), 0)
env = rank_environment(RunDir(Path(sys.argv[1])), plan, "127.0.0.1", 29500, 1)
print(json.dumps({"cores": usable_cores(), "threads": int(env[THREADS_ENV])}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks here")
def test_usable_cores_follow_the_affinity_mask_and_split_the_ranks_threads(
    tmp_path: Path,
) -> None:
    assert usable_cores() == len(os.sched_getaffinity(0))
    # A child pinned to one core: the launcher's thread split must see one core, not the machine.
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the split, not a choice
    done = subprocess.run(
        [sys.executable, "-c", AFFINITY_PROBE, str(tmp_path / "run")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"cores": 1, "threads": 1}


@pytest.mark.parametrize(
    ("asked", "threads"), [("3", 3), ("1", 1), (None, 8), ("0", 8), ("four", 8), (" 2 ", 2)]
)
def test_a_users_omp_num_threads_is_kept_for_every_rank_as_torchrun_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: str | None, threads: int
) -> None:
    from engine.core.common.run_environment import THREADS_ENV
    from engine.core.config.presets import load_preset
    from engine.core.plan.run_plan import plan_run
    from engine.core.runs.rundir import RunDir
    from engine.train.launch import rank_environment

    if asked is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", asked)
    plan = plan_run(load_preset("cpu-demo"), 0)
    env = rank_environment(RunDir(tmp_path / "run"), plan, "127.0.0.1", 29500, 2, cores=16)
    # what the ranks use (torch.set_num_threads) and what environment.json records agree
    assert (env["OMP_NUM_THREADS"], env[THREADS_ENV]) == (str(threads), str(threads))
