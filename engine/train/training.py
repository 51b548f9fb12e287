"""The training loop of one rank, top to bottom (in the style of nanoGPT's train.py and torchvision's
classification reference).

``train_rank`` runs in every rank process after the worker has read the plan and, for ``ddp``, joined
the process group::

    setup = set_up_rank(...)                    model, data, optimizer: the same on every rank
    position = resume_from_checkpoint(...)      a resumed run only: where it goes on
    for epoch in range(position.epoch, epochs):
        figures = train_one_epoch(setup, ...)   steps, throttled step reports (StepReporter),
                                                a checkpoint every training.checkpoint_every
        report_epoch(setup, ...)                figures reduced across ranks, then reported
        evaluate_epoch(setup, ...)              the whole test set, counted across ranks
        take_checkpoint(setup, ...)             every rank together, rank 0 writes

The rank's setup is ``engine.train.rank_setup``, the checkpoint's contents ``engine.train.checkpoint``.
It reports through typed events only; rank 0 alone writes files other than its own events and log
(the checkpoint). Figures an epoch reports are reduced across ranks before they are reported
(``engine.train.epoch_figures``), so every rank's ``EpochEnded`` carries the same ``global_*`` values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from engine.core.config.schema import ModelConfig
from engine.core.plan.run_plan import RunPlan, lr_at_step
from engine.core.runs.events import (
    CheckpointSaved,
    EpochEnded,
    EpochStarted,
    Evaluation,
    EventWriter,
    PhaseStarted,
)
from engine.core.runs.rundir import RunDir
from engine.train.checkpoint import (
    TrainingPosition,
    checkpoint_payload,
    gather_rng_states,
    load_checkpoint,
    resume_from_checkpoint,
    write_checkpoint,
)
from engine.train.checkpoint_schedule import CheckpointSchedule
from engine.train.data import TestBatches
from engine.train.epoch_figures import RankEpoch, reduce_epoch
from engine.train.evaluation import broadcast_buffers, evaluate
from engine.train.image_split import Batch
from engine.train.models import build_model
from engine.train.rank_device import autocast, synchronized_clock
from engine.train.rank_setup import RankSetup, StepCounter, set_up_rank

# ---- one epoch -------------------------------------------------------------------------------


def train_step(setup: RankSetup, batch: Batch, global_step: int) -> tuple[torch.Tensor, float]:
    """One optimizer step on ``batch``; returns its loss (on the device) and its lr."""
    images, labels = batch
    if setup.config.model.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    lr = lr_at_step(setup.plan, global_step)
    for group in setup.optimizer.param_groups:
        group["lr"] = lr
    with autocast(setup.precision, setup.device):
        loss = setup.criterion(setup.model(images), labels)
    setup.optimizer.zero_grad(set_to_none=True)
    setup.faults.before_backward(global_step)
    setup.scaler.scale(loss).backward()
    setup.scaler.step(setup.optimizer)
    setup.scaler.update()
    return loss, lr


@dataclass(frozen=True)
class EpochCheckpoints:
    """Checkpoints inside an epoch: when (``schedule``) and how (``take``: every rank together,
    returning the seconds it took, the same on every rank)."""

    schedule: CheckpointSchedule
    take: Callable[[TrainingPosition], float]

    def after_step(self, epoch: int, step: int, global_step: int, steps: int) -> float:
        """The checkpoint due once the epoch's ``step`` (global ``global_step``, both counted
        after it) is taken, if one is, and the seconds it took (0 when none). The epoch's end
        takes its own, after the evaluation."""
        if step >= steps or not self.schedule.due(global_step):
            return 0.0
        return self.take(TrainingPosition(epoch, step, global_step, steps))


def train_one_epoch(
    setup: RankSetup,
    epoch: int,
    first_global_step: int,
    *,
    start_step: int = 0,
    checkpoints: EpochCheckpoints | None = None,
) -> RankEpoch:
    """The steps of ``epoch`` from its step ``start_step`` (a resumed run; global steps from
    ``first_global_step``), with throttled step reports and the checkpoints due; the figures of
    the steps taken as this rank measured them (device-synchronised, checkpoints left out)."""
    steps = setup.train_batches.steps_per_epoch
    taking = steps - start_step
    warmup = min(setup.config.training.warmup_steps, taking - 1) if taking > 1 else 0
    setup.events.write(EpochStarted(rank=setup.rank, epoch=epoch, steps=steps))
    setup.model.train()
    loss_sum = torch.zeros((), device=setup.device)
    images_seen = steady_images = 0
    data_wait = checkpoint_seconds = steady_checkpoint_seconds = 0.0
    epoch_start = steady_start = synchronized_clock(setup.device)
    setup.step_reports.restart()
    setup.step_timer.restart()
    batches: Iterator[Batch] = setup.train_batches.epoch(epoch, start_step)
    for step in range(start_step, steps):
        global_step = first_global_step + step - start_step
        setup.counter.global_step = global_step
        setup.faults.at_step(global_step)

        fetch_start = time.perf_counter()
        batch = next(batches)
        data_wait += time.perf_counter() - fetch_start
        loss, lr = train_step(setup, batch, global_step)

        loss_sum += loss.detach().float()
        setup.divergence.observe(loss, global_step)
        batch_images = batch[1].shape[0]  # one label per image
        images_seen += batch_images
        taken = step - start_step + 1
        if taken > warmup:
            steady_images += batch_images
        if taken == warmup:
            steady_start = synchronized_clock(setup.device)

        # step_done first: every step is counted. The epoch's last step is always reported, and
        # the run's first: where its loss began (a summary warns when it ends far above).
        due = setup.step_reports.step_done(images=batch_images)
        if due or step + 1 == steps or global_step == 0:
            setup.divergence.check(steps)
            setup.step_reports.report(
                epoch=epoch,
                step=step + 1,
                steps=steps,
                global_step=global_step + 1,
                loss=loss.item(),
                lr=lr,
            )
        if checkpoints is not None:
            seconds = checkpoints.after_step(epoch, step + 1, global_step + 1, steps)
            checkpoint_seconds += seconds
            if taken >= warmup:
                steady_checkpoint_seconds += seconds

    epoch_end = synchronized_clock(setup.device)
    setup.step_timer.flush()  # the time to the next epoch is no step's
    return RankEpoch(
        steps=taking,
        images=images_seen,
        seconds=epoch_end - epoch_start - checkpoint_seconds,
        data_wait_seconds=data_wait,
        warmup_steps=warmup,
        steady_images=steady_images,
        steady_seconds=epoch_end - steady_start - steady_checkpoint_seconds,
        train_loss=loss_sum.item() / taking if taking else 0.0,
        first_step=start_step,
    )


def report_epoch(setup: RankSetup, epoch: int, local: RankEpoch) -> None:
    """The epoch's figures, reduced across ranks first (a collective): one ``EpochEnded`` with this
    rank's and the global figures, and one line in the log."""
    reduced = reduce_epoch(local, setup.device, setup.distributed)
    setup.events.write(
        EpochEnded(
            rank=setup.rank,
            epoch=epoch,
            steps=local.steps,
            images=local.images,
            seconds=local.seconds,
            data_wait_seconds=local.data_wait_seconds,
            warmup_steps=local.warmup_steps,
            steady_images_per_s=local.steady_images_per_s,
            train_loss=local.train_loss,
            global_images=reduced.images,
            global_seconds=reduced.seconds,
            global_data_wait_seconds=reduced.data_wait_seconds,
            global_steady_images_per_s=reduced.steady_images_per_s,
            global_train_loss=reduced.train_loss,
            first_step=local.first_step,
        )
    )
    print(
        f"epoch {epoch + 1}/{setup.config.training.epochs}: {local.steps} steps, "
        f"{reduced.seconds:.2f} s (data {reduced.data_wait_seconds:.2f} s), "
        f"{reduced.steady_images_per_s:.0f} img/s, train loss {reduced.train_loss:.4f}",
        flush=True,
    )


# ---- evaluation and checkpoint ---------------------------------------------------------------


def evaluate_epoch(setup: RankSetup, epoch: int, test_batches: TestBatches) -> None:
    """The whole test set after ``epoch`` (collectives under DDP: every rank calls it), announced
    as a slow phase, reported as one ``Evaluation`` and one line in the log."""
    setup.events.write(PhaseStarted(rank=setup.rank, phase="evaluation"))
    setup.faults.before_evaluation(epoch)
    eval_start = synchronized_clock(setup.device)
    if setup.distributed:
        broadcast_buffers(setup.raw_model)
    # DataParallel splits test batches across its GPUs; DDP evaluates the bare module.
    dataparallel = setup.config.strategy.name == "dataparallel"
    result = evaluate(
        setup.model if dataparallel else setup.raw_model,
        test_batches,
        device=setup.device,
        precision=setup.precision,
        channels_last=setup.config.model.channels_last,
        distributed=setup.distributed,
    )
    setup.events.write(
        Evaluation(
            rank=setup.rank,
            epoch=epoch,
            accuracy=result.accuracy,
            loss=result.loss,
            samples=result.samples,
            seconds=synchronized_clock(setup.device) - eval_start,
        )
    )
    print(
        f"  test accuracy {result.accuracy:.2%} on {result.samples} images, loss {result.loss:.4f}",
        flush=True,
    )


def take_checkpoint(
    setup: RankSetup, run_dir: RunDir, attempt: int, position: TrainingPosition
) -> float:
    """Every rank together (under DDP): each rank's RNG states to rank 0, which alone writes the
    checkpoint (every rank holds the same weights), then a barrier, so every rank's epoch leaves
    the same write out of its time. Returns the seconds it took."""
    start = time.perf_counter()
    setup.events.write(PhaseStarted(rank=setup.rank, phase="checkpoint"))
    rng = gather_rng_states(setup.rank, setup.world_size, setup.distributed)
    if setup.rank == 0:
        payload = checkpoint_payload(
            raw_model=setup.raw_model,
            optimizer=setup.optimizer,
            scaler=setup.scaler,
            position=position,
            rng=rng,
            model_label=setup.config.model.label,
        )
        path = run_dir.checkpoint_path
        size = write_checkpoint(run_dir.path, path, payload, attempt)
        setup.events.write(
            CheckpointSaved(
                rank=setup.rank, path=str(path), bytes=size, global_step=position.global_step
            )
        )
    if setup.distributed:
        dist.barrier()
    return time.perf_counter() - start


def resume_rank(setup: RankSetup, path: Path) -> TrainingPosition:
    """This rank as the checkpoint at ``path`` left it (every rank loads the same file)."""
    distributed = setup.distributed
    return resume_from_checkpoint(
        load_checkpoint(path),
        path,
        raw_model=setup.raw_model,
        optimizer=setup.optimizer,
        scaler=setup.scaler,
        rank=setup.rank if distributed else 0,
        world_size=setup.world_size if distributed else 1,
        steps_per_epoch=setup.train_batches.steps_per_epoch,
    )


# ---- the rank --------------------------------------------------------------------------------


def train_rank(
    run_dir: RunDir,
    plan: RunPlan,
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    events: EventWriter,
    model_factory: Callable[[ModelConfig], nn.Module] = build_model,
    resume_from: Path | None = None,
    attempt: int = 1,
    counter: StepCounter | None = None,
) -> None:
    """Train one rank as ``plan`` says. For ``ddp`` the process group must be initialised.

    ``model_factory`` builds the unwrapped model after the seed is set (so every rank starts from
    the same weights); the default is the configured model. Tests pass a SmallCNN without
    BatchNorm. ``resume_from``: a checkpoint this run goes on from, taking exactly the steps an
    uninterrupted run would have taken after it (``attempt``: the run's how-manieth start, in the
    checkpoints it writes, and which faults fire). ``counter``: where the step being taken is
    kept for the caller (the step of a failure).
    """
    setup = set_up_rank(
        plan,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        events=events,
        model_factory=model_factory,
        attempt=attempt,
        counter=counter or StepCounter(),
    )
    steps = setup.train_batches.steps_per_epoch
    try:
        position = TrainingPosition(steps_per_epoch=steps)
        if resume_from is not None:
            position = resume_rank(setup, resume_from)
        train_epochs(setup, run_dir, position, attempt)
    finally:  # global hooks: none is left behind in a process that goes on
        setup.step_timer.close()


def train_epochs(
    setup: RankSetup, run_dir: RunDir, position: TrainingPosition, attempt: int
) -> None:
    """Every epoch from ``position`` on, each ended by its figures, its evaluation and a
    checkpoint; checkpoints inside epochs as ``training.checkpoint_every`` says."""
    training = setup.config.training
    steps = setup.train_batches.steps_per_epoch
    checkpoints = (
        EpochCheckpoints(
            CheckpointSchedule(
                training.checkpoint_interval,
                device=setup.device,
                distributed=setup.distributed,
                first_global_step=position.global_step,
            ),
            lambda at: take_checkpoint(setup, run_dir, attempt, at),
        )
        if training.checkpoint
        else None
    )
    global_step = position.global_step
    for epoch in range(position.epoch, training.epochs):
        start_step = position.step if epoch == position.epoch else 0
        figures = train_one_epoch(
            setup, epoch, global_step, start_step=start_step, checkpoints=checkpoints
        )
        global_step += figures.steps
        report_epoch(setup, epoch, figures)
        if setup.test_batches is not None:
            evaluate_epoch(setup, epoch, setup.test_batches)
        if checkpoints is not None:
            checkpoints.take(TrainingPosition(epoch + 1, 0, global_step, steps))
