#!/usr/bin/env bash
# The GPU paths in one go, for a machine with at least one NVIDIA GPU: under 8 minutes on one GPU.
#
#   bash bench/gpu_check.sh                # from the repository root, with .venv set up
#   PYTHON=python3 bash bench/gpu_check.sh # another interpreter with ddptui's dependencies
#   GPU_CHECK_QUICK=1 bash bench/gpu_check.sh   # leave out the two ResNet-50 tutorial runs
#
# Besides training on the GPU, it checks `ddptui gpus --json` while a run holds GPU 0.
#
# Prints one line per check, "ok" or "FAIL" with its figure or reason, then a count:
#
#   nvml                ok    1 GPU: NVIDIA H100 80GB HBM3, driver 550.54, 1.2/80.0 GiB used, 0% busy
#   single fp32         ok    resnet18: 14,210 img/s steady, epoch 1.44 s, data wait 1%, test acc 31.2%
#   ...
#
# Exit code: 0 when every check passed, 1 otherwise. Runs go to a temporary runs directory that is
# removed at the end; nothing is recorded in the results history.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
RUNS=$(mktemp -d -t ddptui-gpu-check-XXXXXX)
trap 'rm -rf "$RUNS"' EXIT
FAILED=0
STARTED=$(date +%s)
export DDPTUI_RUNS_DIR="$RUNS"

# ResNet-18 on synthetic CIFAR-shaped data, tensor pipeline on the GPU: seconds of training each.
QUICK=(--data synthetic --model resnet18 --epochs 1 --batch-size 256
       --set data.pipeline=tensor --set data.train_size=25600 --set data.test_size=5000
       --set training.checkpoint=false --set model.channels_last=true)

line() {  # name, status, text
    printf '%-24s %-5s %s\n' "$1" "$2" "$3"
    [ "$2" = ok ] || FAILED=$((FAILED + 1))
}

# Runs `ddptui run ARGS --json` and turns its summary.json into one line.
check_run() {
    local name=$1
    shift
    local out err
    err=$(mktemp)
    out=$(timeout 300 "$PYTHON" -m ddptui run "$@" --json 2>"$err")
    local code=$?
    local verdict
    verdict=$(printf '%s' "$out" | "$PYTHON" -c '
import json, sys
try:
    s = json.load(sys.stdin)
except Exception:
    print("FAIL\tno summary.json came back"); sys.exit()
e = (s.get("epochs") or [{}])[-1]
if s.get("status") != "completed" or not e:
    f = s.get("failure") or {}
    print("FAIL\t" + s.get("status", "?") + ": " + (f.get("error") or s.get("reason") or "no epoch finished"))
    sys.exit()
acc = e.get("test_accuracy")
wait = e["data_wait_seconds"] / e["seconds"] if e.get("seconds") else 0.0
print("ok\t%s %s on %s: %s img/s steady, epoch %.2f s (steady %.2f s), data wait %.0f%%%s" % (
    s["model"], s["precision"], s["devices"], format(round(e["steady_images_per_s"]), ","),
    e["seconds"], e["steady_epoch_seconds"], 100 * wait,
    "" if acc is None else ", test acc %.1f%%" % (100 * acc)))
')
    if [ $code -eq 124 ]; then
        verdict=$'FAIL\ttook over 300 s'
    elif [ $code -eq 2 ]; then
        verdict=$'FAIL\t'"$(tail -n 1 "$err")"
    fi
    rm -f "$err"
    line "$name" "${verdict%%$'\t'*}" "${verdict#*$'\t'}"
}

echo "ddptui GPU check on $(hostname), $(date -u +%Y-%m-%dT%H:%MZ), python: $PYTHON"

# 1. NVML sampling, the thin layer the UI's GPU panel reads.
nvml=$("$PYTHON" - <<'EOF'
from engine.core.host.gpus import sample_gpus
inv = sample_gpus()
if inv.error or not inv.gpus:
    print("FAIL\t" + (inv.error or "NVML sees no GPU"))
else:
    parts = []
    for g in inv.gpus:
        if g.error:
            parts.append(f"GPU {g.index}: {g.error}")
        else:
            gib = 2**30
            parts.append(
                f"{g.name}, {g.memory_used_bytes / gib:.1f}/{g.memory_total_bytes / gib:.1f} GiB "
                f"used, {g.utilization_percent}% busy, {g.temperature_c} C, {g.power_watts} W"
            )
    bad = any(g.error for g in inv.gpus)
    print(("FAIL" if bad else "ok") + f"\t{inv.count} GPU(s), driver {inv.driver_version}: " + "; ".join(parts))
EOF
)
line "nvml" "${nvml%%$'\t'*}" "${nvml#*$'\t'}"

# 2-4. One GPU, each precision.
check_run "single fp32" cpu-demo --set strategy.name=single --devices 1 --precision fp32 "${QUICK[@]}"
check_run "single bf16" cpu-demo --set strategy.name=single --devices 1 --precision bf16 "${QUICK[@]}"
check_run "single fp16 (amp)" cpu-demo --set strategy.name=single --devices 1 --precision fp16 "${QUICK[@]}"

# 5. The tensor pipeline on the GPU against PIL + DataLoader workers.
pipe=$(timeout 120 "$PYTHON" bench/data_pipeline.py --device cuda --rounds 1 --seconds 3 \
    --threads 4 --workers 4 --json 2>&1)
pipe_line=$(printf '%s' "$pipe" | "$PYTHON" -c '
import json, sys
text = sys.stdin.read()
try:
    d = json.loads(text[text.index("{"):])
    f = d["as asked"]
    print("ok\ttensor %s img/s on the GPU vs torchvision %s img/s with 4 workers: %.1fx" % (
        format(round(f["tensor_images_per_s"]), ","), format(round(f["torchvision_images_per_s"]), ","),
        f["wall_ratio"]))
except Exception as err:
    print("FAIL\t" + (text.strip().splitlines() or ["no output"])[-1][:200])
')
line "tensor pipeline" "${pipe_line%%$'\t'*}" "${pipe_line#*$'\t'}"

# 6. DDP on NCCL with one rank: process group, DDP wrapper, all-reduce of the epoch figures.
check_run "ddp nccl x1" cpu-demo --set strategy.name=ddp --devices 1 --set ddp.backend=nccl "${QUICK[@]}"

# 6b. A stuck NCCL run: every rank's stack on demand, and an on-demand flight-recorder dump
# (through NCCL's debug pipe) that lands in the run directory and that `ddptui show` points at.
stuck=$("$PYTHON" -m ddptui run cpu-demo --set strategy.name=ddp --devices 1 --set ddp.backend=nccl \
    "${QUICK[@]}" --set training.max_steps=100000 --fault hang:0:20 --detach 2>&1 | tail -n 1)
stuck_line=$(STUCK="$stuck" timeout 240 "$PYTHON" - <<'EOF_STUCK'
import json, os, subprocess, sys, time
from pathlib import Path
run_id = os.environ["STUCK"]
runs = Path(os.environ["DDPTUI_RUNS_DIR"])
def ddptui(*args):
    return subprocess.run([sys.executable, "-m", "ddptui", *args], capture_output=True, text=True)
try:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the hang: rank 0 past step 20
        shown = json.loads(ddptui("show", run_id, "--json").stdout or "{}")
        steps = [r.get("global_step") or 0 for r in shown.get("ranks", [])]
        if steps and min(steps) >= 20:
            break
        time.sleep(1)
    stacks = ddptui("stacks", run_id, "--json")
    snap = json.loads(stacks.stdout) if stacks.returncode == 0 else {}
    ranks = snap.get("ranks") or []
    dump = runs / run_id / "flight-recorder" / "rank_0"
    for _ in range(60):
        if dump.exists() and dump.stat().st_size > 0:
            break
        time.sleep(0.5)
    show = ddptui("show", run_id).stdout
    problems = []
    if not ranks or not ranks[0].get("stack"):
        problems.append("no stack: " + (stacks.stderr.strip() or "empty snapshot"))
    elif "faults.py" not in (ranks[0].get("where") or ""):
        problems.append("the culprit frame is " + str(ranks[0].get("where")))
    if not dump.exists():
        problems.append("no flight-recorder dump in the run directory")
    if "flight recorder:" not in show:
        problems.append("ddptui show does not point at the dump")
    method = ranks[0].get("method") if ranks else "-"
    if problems:
        print("FAIL\t" + "; ".join(problems))
    else:
        print(f"ok\tstack by {method}: {snap.get('summary')}; dump {dump.stat().st_size} bytes")
finally:
    ddptui("kill", run_id)
EOF_STUCK
)
line "stuck nccl: stacks+fr" "${stuck_line%%$'\t'*}" "${stuck_line#*$'\t'}"

# 6c. The user's own script (the tutorial's loop, no ddptui in it) on one GPU under `ddptui run`:
# NCCL, the optimizer step hook's progress, a completed summary with its step count.
script_out=$(timeout 300 "$PYTHON" -m ddptui run tests/fixtures/tutorial_ddp.py --devices 1 \
    --json -- --epochs 2 --steps 50 2>/dev/null)
script_line=$(printf '%s' "$script_out" | "$PYTHON" -c '
import json, sys
try:
    s = json.load(sys.stdin)
except Exception:
    print("FAIL\tno summary.json came back"); sys.exit()
if s.get("status") != "completed" or s.get("global_steps") != 100:
    f = s.get("failure") or {}
    print("FAIL\t%s, %s steps: %s" % (s.get("status"), s.get("global_steps"), f.get("error") or s.get("reason")))
else:
    print("ok\tcompleted on %s: %d optimizer steps counted by the hook, %.1f s" % (
        s["devices"], s["global_steps"], s["elapsed_seconds"]))
')
line "script run (1 GPU)" "${script_line%%$'\t'*}" "${script_line#*$'\t'}"

# 6d. Why is it slow, on the GPU: a DDP run's every rank's step split into data, forward,
# backward, sync (the engine's timed all-reduce), optimizer and other, timed with CUDA events
# resolved later (no synchronize in the step); the parts add up to the rank's step time from its
# step reports within 10 %, and the run's bottleneck is one sentence. The user's script of 6c is
# split the same way, on CUDA events, its sync inside backward.
split_check() {  # name, then the ddptui run arguments
    local name=$1
    shift
    local out verdict
    out=$(timeout 300 "$PYTHON" -m ddptui run --json "$@" 2>/dev/null)  # --json before a script's --
    verdict=$(printf '%s' "$out" | "$PYTHON" -c '
import json, sys
try:
    s = json.load(sys.stdin)
except Exception:
    print("FAIL\tno summary.json came back"); sys.exit()
script = s.get("strategy") == "script"
split = s.get("step_breakdown") or []
problems = [] if s.get("status") == "completed" else ["the run " + str(s.get("status"))]
if not split:
    problems.append("no step_breakdown in summary.json")
for b in split:
    parts = sum(b[k] or 0.0 for k in ("data", "forward", "backward", "sync", "optimizer", "other"))
    step = b.get("step_seconds") or 0.0
    if b.get("clock") != "cuda":
        problems.append("rank %d timed on %s, not CUDA events" % (b["rank"], b.get("clock")))
    if (b.get("sync") is None) != script:
        problems.append("rank %d: sync %s" % (b["rank"], "timed apart in a script" if script else "not timed apart"))
    if not step or abs(parts / step - 1) > 0.10:
        problems.append("rank %d: parts %.2f ms against its step %.2f ms" % (b["rank"], 1e3 * parts, 1e3 * step))
if not s.get("bottleneck"):
    problems.append("no bottleneck sentence")
if problems:
    print("FAIL\t" + "; ".join(problems)); sys.exit()
b = split[0]
ms = lambda v: "-" if v is None else "%.1f" % (1e3 * v)
print("ok\trank 0 of %d, ms a step on CUDA events: data %s, forward %s, backward %s, sync %s, optimizer %s, other %s (its step %s, %d timed); %s" % (
    len(split), ms(b["data"]), ms(b["forward"]), ms(b["backward"]), ms(b.get("sync")), ms(b["optimizer"]),
    ms(b["other"]), ms(b["step_seconds"]), b["steps"], s["bottleneck"]))
')
    line "$name" "${verdict%%$'\t'*}" "${verdict#*$'\t'}"
}
split_check "ddp step split (cuda)" cpu-demo --set strategy.name=ddp --devices 1 --set ddp.backend=nccl "${QUICK[@]}"
split_check "script step split" tests/fixtures/tutorial_ddp.py --devices 1 -- --epochs 1 --steps 60

# 6b. A one-GPU NCCL run listens on loopback only: its ranks meet through a file store in the run
# directory and NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name the loopback interface.
listen=$("$PYTHON" - <<'EOF'
import os, subprocess, sys, time
from pathlib import Path
import psutil
from engine.core.runs.rundir import RunDir
started = subprocess.run(
    [sys.executable, "-m", "ddptui", "run", "cpu-demo", "--set", "strategy.name=ddp", "--devices", "1",
     "--set", "ddp.backend=nccl", "--data", "synthetic", "--model", "resnet18", "--epochs", "50",
     "--set", "training.evaluate=false", "--set", "training.checkpoint=false", "--detach"],
    capture_output=True, text=True)
if started.returncode:
    print("FAIL\t" + (started.stderr.strip().splitlines() or ["did not start"])[-1]); sys.exit()
run = RunDir(Path(os.environ["DDPTUI_RUNS_DIR"]) / started.stdout.strip().splitlines()[-1])
sockets, seen = [], False
try:
    deadline = time.time() + 180
    while time.time() < deadline and not seen:
        try:
            info = run.read_run_info()
        except Exception:
            info = None
        if info and info.ranks and info.launcher and len(run.rank_event_paths()) == len(info.ranks):
            time.sleep(10)  # NCCL opens its bootstrap and proxy sockets in the first steps
            pids = {info.launcher.pid, *(r.pid for r in info.ranks)}
            for pid in list(pids):
                try:
                    pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
                except psutil.Error:
                    pass
            sockets = [(c.pid, c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
                       if c.status == psutil.CONN_LISTEN and c.pid in pids]
            seen = True
        time.sleep(0.5)
finally:
    subprocess.run([sys.executable, "-m", "ddptui", "kill", run.run_id, "--grace", "5"],
                   capture_output=True)
beyond = [s for s in sockets if not s[1].startswith(("127.", "::1"))]
if not seen:
    print("FAIL\tthe run never trained: see " + str(run.logs_dir))
elif beyond:
    print("FAIL\tlistening beyond loopback: " + ", ".join(f"pid {p} on {ip}:{port}" for p, ip, port in beyond))
else:
    where = ", ".join(f"{ip}:{port}" for _, ip, port in sockets) or "none at all"
    print(f"ok\t{len(sockets)} listening socket(s) of the run, all on loopback: {where}")
EOF
)
line "nccl loopback only" "${listen%%$'\t'*}" "${listen#*$'\t'}"

# 7. DataParallel on one GPU.
check_run "dataparallel x1" cpu-demo --set strategy.name=dataparallel --devices 1 "${QUICK[@]}"

# 8. ddptui gpus --json while a run holds GPU 0: the run's rank is on GPU 0, named as ddptui's,
# with GPU memory from NVML; after ddptui kill, nothing of it is left on the GPU.
gpus_check() {
    local log run_pid out verdict
    log=$(mktemp)
    "$PYTHON" -m ddptui run cpu-demo --set strategy.name=single --devices 0 "${QUICK[@]}" \
        --epochs 20 >"$log" 2>&1 &
    run_pid=$!
    verdict=$'FAIL\tno ddptui rank appeared on GPU 0 within 120 s'
    for _ in $(seq 120); do
        out=$(timeout 60 "$PYTHON" -m ddptui gpus --json 2>&1)
        verdict=$(printf '%s' "$out" | "$PYTHON" -c '
import json, sys
try:
    d = json.load(sys.stdin)
except Exception:
    print("wait\tddptui gpus --json printed no JSON"); sys.exit()
if d.get("error"):
    print("FAIL\t" + d["error"]); sys.exit()
rows = [p for p in d["processes"] if p["gpu"] == 0 and p["kind"] == "ddptui"]
if not rows:
    print("wait\tno ddptui rank on GPU 0 yet"); sys.exit()
r = rows[0]
mem = r["gpu_memory_bytes"]
if not mem:
    print("FAIL\t%s on GPU 0 but NVML gave no memory for it" % r["what"]); sys.exit()
print("ok\t%s (pid %d) on GPU 0 with %.2f GiB, %d process(es) listed on %d GPU(s)" % (
    r["what"], r["pid"], mem / 2**30, len(d["processes"]), len(d["gpus"])))
')
        [ "${verdict%%$'\t'*}" = wait ] || break
        kill -0 "$run_pid" 2>/dev/null || { verdict=$'FAIL\tthe run ended first: '"$(tail -n 1 "$log")"; break; }
        sleep 1
    done
    local run_id
    run_id=$("$PYTHON" -m ddptui runs --json 2>/dev/null | "$PYTHON" -c '
import json, sys
runs = [r for r in json.load(sys.stdin) if r["state"] in ("running", "starting")]
print(runs[0]["run_id"] if runs else "")')
    [ -n "$run_id" ] && timeout 60 "$PYTHON" -m ddptui kill "$run_id" --grace 5 >/dev/null 2>&1
    wait "$run_pid" 2>/dev/null
    if [ "${verdict%%$'\t'*}" = ok ]; then
        left=$(timeout 60 "$PYTHON" -m ddptui gpus --json | "$PYTHON" -c '
import json, sys
d = json.load(sys.stdin)
print(len([p for p in d["processes"] if p["kind"] == "ddptui"]))')
        [ "$left" = 0 ] && verdict="$verdict; none left after ddptui kill" \
            || verdict=$'FAIL\t'"$left ddptui process(es) still on a GPU after ddptui kill"
    fi
    [ "${verdict%%$'\t'*}" = wait ] && verdict=$'FAIL\t'"${verdict#*$'\t'}"
    rm -f "$log"
    line "gpus --json" "${verdict%%$'\t'*}" "${verdict#*$'\t'}"
}
gpus_check

# 9-10. The tutorial's workload on one GPU (ResNet-50, 1,000-class head, batch 256, one epoch of
# 50,000 images; synthetic data stands in for CIFAR-10 when it is not on disk): its 13.2 s A100
# figure next to ours, with the tutorial's PIL pipeline and with the tensor pipeline.
if [ -z "${GPU_CHECK_QUICK:-}" ]; then
    TUTORIAL=(--data synthetic --set training.checkpoint=false)
    check_run "tutorial single" seed-single "${TUTORIAL[@]}"
    check_run "tutorial single, tensor" seed-single "${TUTORIAL[@]}" --set data.pipeline=tensor
fi

echo "$((FAILED)) check(s) failed, $(( $(date +%s) - STARTED )) s"
[ "$FAILED" -eq 0 ]
