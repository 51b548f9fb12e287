"""The pieces of the Slurm backend that need no cluster: a preset's [slurm] section, the batch
script ddptui writes, stacks taken by a signal Slurm delivers, the node launchers' records read
back into what wrote them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.core.backends.slurm.config import SlurmConfig, parse_sbatch_option
from engine.core.backends.slurm.records import NodeRecord, read_node_records, write_node_record
from engine.core.backends.slurm.submit import SlurmRequest, batch_script, node_plan, srun_command
from engine.core.common.config_error import ConfigError
from engine.core.config.presets import load_preset
from engine.core.config.toml_io import apply_overrides, load_config, to_toml
from engine.core.host.gpus import GpuInventory, GpuSample
from engine.core.runs.node_files import NodeGpus, read_node_gpus, write_node_gpus
from engine.core.runs.rundir import RunDir
from engine.core.stacks.capture import capture_by_signal
from tests.fixtures.slurm_runs import node_record

DUMP = """Thread 0x00007f (most recent call first):
  File "/work/engine/train/faults.py", line 35 in hang
  File "/work/engine/train/training.py", line 120 in train_rank
  File "<string>", line 1 in <module>
"""


def test_a_presets_slurm_section_is_checked_where_made_and_written_only_when_used(
    tmp_path: Path,
) -> None:
    config = load_preset("cpu-demo")
    assert "[slurm]" not in to_toml(config)  # every run on one machine: config.toml as before
    asked = apply_overrides(
        config,
        {"slurm.nodes": 4, "slurm.time": "2-12:00", "slurm.sbatch": {"constraint": "a100"}},
    )
    path = tmp_path / "p.toml"
    path.write_text(to_toml(asked))
    assert "[slurm]" in path.read_text() and load_config(path) == asked
    for time_limit in ("30", "1:30:00", "2-12", "0:30", "UNLIMITED"):
        assert SlurmConfig(time=time_limit).time == time_limit
    with pytest.raises(ConfigError, match=r"slurm\.nodes is 0; it must be 1 or more"):
        SlurmConfig(nodes=0)
    with pytest.raises(ConfigError, match=r"slurm\.partition is 'a b'"):
        SlurmConfig(partition="a b")
    with pytest.raises(ConfigError, match="--sbatch output is set by ddptui itself"):
        parse_sbatch_option("--output=x")
    with pytest.raises(ConfigError, match="must be one line"):
        SlurmConfig(sbatch={"comment": "a\nb"})
    assert parse_sbatch_option("--exclusive") == ("exclusive", "")


def test_the_batch_script_starts_one_node_launcher_per_node_then_settles(tmp_path: Path) -> None:
    config = apply_overrides(
        load_preset("cpu-demo"),
        {
            "devices.spec": "cpu:3",
            "slurm.nodes": 2,
            "slurm.partition": "gpu",
            "slurm.time": "30",
            "slurm.account": "proj",
            "slurm.qos": "high",
            "slurm.sbatch": {"constraint": "a100", "exclusive": ""},
        },
    )
    plan, known = node_plan(config)
    assert known and plan.world_size == 3
    request = SlurmRequest(plan=plan, nodes=2, world_size=6, devices="cpu:3 on 2 nodes")
    run_dir = RunDir(tmp_path / "runs" / "20261205-120000-cpu-demo-abcd")
    script = batch_script(run_dir, config, request).splitlines()
    options = [line.removeprefix("#SBATCH ") for line in script if line.startswith("#SBATCH")]
    assert options[:4] == [
        "--job-name=ddptui-cpu-demo",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=3",
    ]
    assert options[-6:] == [
        "--partition=gpu", "--time=30", "--account=proj", "--qos=high",
        "--constraint=a100", "--exclusive",
    ]  # fmt: skip
    step = srun_command(run_dir, config, request)
    assert step[:5] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=3",
    ]
    marker = f"DDPTUI_RUN_ID={run_dir.run_id},DDPTUI_RUN_DIR={run_dir.path.resolve()}"
    assert f"--export=ALL,{marker},PYTHONUNBUFFERED=1" in step
    assert step[-3:] == ["-m", "engine.train.node_launch", str(run_dir.path.resolve())]
    # the job's own steps around its node launchers: a requeued job's next attempt first, then
    # the run's end or its next attempt in this allocation after each step
    job_steps = "-m engine.core.backends.slurm.job_steps"
    assert script[-6].endswith(f"{job_steps} begin {run_dir.path} || exit 1")
    assert script[-5:-2] == ["while :; do", "    " + " ".join(step), "    code=$?"]
    assert script[-2].endswith(f"{job_steps} finish {run_dir.path} || exit $code")
    assert script[-1] == "done"
    assert "--open-mode=append" in options  # a requeued job's output goes on after the first's
    assert "--requeue" not in options  # no restarts: Slurm ends the job when a node fails
    restarting = apply_overrides(config, {"supervision.max_restarts": 1})
    script = batch_script(run_dir, restarting, request).splitlines()
    assert "#SBATCH --requeue" in script  # restarts: Slurm requeues it instead
    with pytest.raises(ConfigError, match="give a count per node"):
        node_plan(apply_overrides(config, {"devices.spec": "0,1"}))


def test_stacks_taken_by_a_signal_that_slurm_delivers(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    answers, silent = stacks / "pid-10@n2.txt", stacks / "pid-11@n1.txt"
    for path in (answers, silent):
        path.write_text("an earlier dump\n")
    delivered = []

    def deliver() -> str:
        delivered.append(time.monotonic())
        with open(answers, "a") as f:  # the rank on n2 answers; the one on n1 never does
            f.write(DUMP)
        return ""

    taken = capture_by_signal({1: (10, answers), 0: (11, silent)}, deliver, wait=0.5)
    assert len(delivered) == 1
    assert taken[1].method == "faulthandler" and taken[1].text == DUMP
    assert taken[1].main_thread is not None
    assert taken[1].main_thread.frames[0].function == "hang"
    assert taken[0].problem == "it wrote no stack within 0.5 s"
    refused = capture_by_signal({1: (10, answers)}, lambda: "`scancel` failed: no such job")
    assert refused[1].problem == "`scancel` failed: no such job"


def test_a_dump_a_node_appends_is_read_to_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.core.stacks import capture

    monkeypatch.setattr(capture, "DUMP_MAX_BYTES", 64)
    (tmp_path / "stacks").mkdir()
    dump = tmp_path / "stacks" / "pid-10@n2.txt"
    dump.write_text("")

    def deliver() -> str:
        dump.write_text(DUMP * 100)  # a rank that writes far more than any stack
        return ""

    taken = capture_by_signal({1: (10, dump)}, deliver, wait=0.5)
    assert taken[1].text == (DUMP * 100)[:64]


def test_node_records_and_gpu_samples_read_back_into_what_wrote_them(tmp_path: Path) -> None:
    from engine.core.common.statuses import RunStatus

    written = node_record("n2", 1, RunStatus.COMPLETED)
    write_node_record(tmp_path, written)
    records, problems = read_node_records(tmp_path)
    assert records == {"n2": written} and problems == ()
    assert NodeRecord.from_json(written.to_json()) == written
    (tmp_path / "nodes" / "bad.json").write_text("{not json")
    _, problems = read_node_records(tmp_path)
    assert len(problems) == 1 and "bad.json" in problems[0]
    sample = NodeGpus(
        "n1",
        5.0,
        GpuInventory(gpus=(GpuSample(0, "H100", memory_used_bytes=2**30, utilization_percent=40),)),
    )
    write_node_gpus(tmp_path, sample)
    assert read_node_gpus(tmp_path) == {"n1": sample}
    with pytest.raises(ValueError, match="not a node name"):
        write_node_record(tmp_path, node_record("../etc", 0, RunStatus.RUNNING))


def test_a_node_record_over_its_bound_or_behind_a_link_is_named_not_read(tmp_path: Path) -> None:
    from engine.core.common.run_layout import NODES_DIR
    from engine.core.runs.node_files import RECORD_LIMIT

    run_path = tmp_path / "run"
    nodes = run_path / NODES_DIR
    nodes.mkdir(parents=True)
    (nodes / "n1.json").write_bytes(b" " * (RECORD_LIMIT + 1))
    (tmp_path / "elsewhere.json").write_text("{}")
    (nodes / "n2.json").symlink_to(tmp_path / "elsewhere.json")
    found, problems = read_node_records(run_path)
    assert found == {}
    assert problems == (
        f"{nodes / 'n1.json'}: {nodes / 'n1.json'} is 1 MiB, over the 1 MiB ddptui reads of "
        "such a file: not loaded",
        f"{nodes / 'n2.json'}: {nodes / 'n2.json'} is a symbolic link "
        f"({tmp_path / 'elsewhere.json'}): not followed",
    )
