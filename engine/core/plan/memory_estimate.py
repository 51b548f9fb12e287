"""How much memory a run's processes will hold, worked out from its plan before anything starts.

Plain Python: the UI and the resource guard import this, so it never imports torch. Parameter
counts are a table (``tests/test_resource_guard.py`` checks it against the real models); every
other figure is a constant measured on real ranks by ``bench/rank_memory.py`` and padded so that
the estimate is never below what was measured. A caller may rely on the estimate being an upper
bound for what was measured, not on it being tight.

What one run holds on the host:

- the launcher (``python -m engine.train.launch``: an interpreter with torch imported);
- per rank: the interpreter with torch imported, the model's parameters, gradients, momentum and
  DDP's gradient buckets, the activations of one training batch, and the data set, which every
  rank holds whole (``engine.train.data.load_split``) - more than once while it is being made;
- per rank with the ``torchvision`` pipeline: ``data.num_workers`` DataLoader workers for training
  (persistent, so still alive at evaluation) plus as many for evaluation. Ranks are started with
  ``spawn``, so their workers are spawned too: each is a fresh interpreter that imports torch and
  gets its own pickled copy of its split;
- per CUDA rank: the CUDA context's host memory instead of the activations.

And on each GPU: the CUDA context, the model state, the activations of its share of the batch and,
with the ``tensor`` pipeline, the data set (the training split and this rank's share of the test
split).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.config.schema import ModelConfig, RunConfig
from engine.core.plan.run_plan import RunPlan

MIB = 2**20
GIB = 2**30

IMAGE_BYTES = 3 * 32 * 32 + 8  # one uint8 image (3 x 32 x 32) and its int64 label
PIXEL_BYTES = 3 * 32 * 32  # what a DataLoader worker holds per image (a uint8 HWC array)
PARAMETER_BYTES = 4  # fp32 master weights, whatever the autocast precision

# ---- measured on the CPU ---------------------------------------------------------------------
#
# `.venv/bin/python bench/rank_memory.py --batch-sizes 32,128,256 --max-steps 2` on the 2-core,
# 24 GiB test machine (torch 2.14.1+cu130, Python 3.11): DDP on cpu:2, synthetic data, train 12000
# + test 2000 images, tensor pipeline, the evaluation and the checkpoint included. Peak RSS (VmHWM)
# of the larger rank in MiB, and the estimate / measured ratio with the constants below:
#
#   model      batch 32      batch 128     batch 256
#   small_cnn   761  1.19     798  1.20     877  1.18
#   resnet18    944  1.14     992  1.15    1069  1.16
#   resnet34   1100  1.12    1136  1.15    1235  1.14
#   resnet50   1165  1.14    1324  1.19    1617  1.18
#
#   --models small_cnn,resnet50 --batch-sizes 32 --train-sizes 2000,50000: small_cnn 733 / 990
#     (1.15 / 1.15), resnet50 1144 / 1284 (1.11 / 1.21): 5.4 KiB more per image, 1.8 x IMAGE_BYTES
#   --models small_cnn --batch-sizes 8 --train-sizes 512 --test-size 256: 713 (the base:
#     interpreter, torch, gloo, engine)
#   --models small_cnn,resnet18 --batch-sizes 32 --train-sizes 512,12000,50000
#     --pipeline torchvision --num-workers 2: ranks 750 / 822 / 1156 and 910 / 944 / 1199
#     (1.11-1.22; 2.9 x IMAGE_BYTES per image); one worker's USS 478-550, one rank's 4 workers
#     together 1648-1875 (1.24-1.49)
#   launcher: 527 to 638 over all the runs above (1.13-1.37)
#
# Read against the model: the base is ~705 MiB; the model state is 3.4 to 3.7 x the parameter
# bytes; activations grow by 0.48 (small_cnn), 0.56 (resnet18), 0.49 (resnet34) and 2.1 to 2.4
# (resnet50) MiB per image of the batch. The constants below pad each by 10-25 %. A machine with
# more cores gives each rank more threads (more per-thread scratch memory) and more ranks (more
# gloo connections); the padding is meant for that, and bench/rank_memory.py is how to check.

RANK_BASE_BYTES = 800 * MIB
LAUNCHER_BYTES = 720 * MIB
# Parameters, gradients, SGD momentum and DDP's gradient buckets.
MODEL_STATE_COPIES = 4
ACTIVATION_BYTES_PER_IMAGE = {
    "small_cnn": int(0.6 * MIB),
    "resnet18": int(0.7 * MIB),
    "resnet34": int(0.8 * MIB),
    "resnet50": int(2.6 * MIB),
}
# Copies of the data set a rank holds at its peak, by (dataset, pipeline). Synthetic + tensor:
# the images and the noise gathered onto them (measured 1.8). Synthetic + torchvision: those and
# the HWC array the PIL dataset keeps (measured 2.9). CIFAR-10 is not on the test machine, so its
# figures are counted, not measured: torchvision's CIFAR10 holds the five batches and their
# stacked array (2), and the tensor pipeline then makes an HWC and a CHW copy of it (3).
DATA_COPIES = {
    ("synthetic", "tensor"): 2.0,
    ("synthetic", "torchvision"): 3.0,
    ("cifar10", "tensor"): 3.0,
    ("cifar10", "torchvision"): 2.0,
}
# The training sampler's index lists (Python ints) and their tensor, per training image.
SAMPLER_BYTES_PER_IMAGE = 200
# One spawned DataLoader worker without its data: its unique memory (USS; the library pages it
# shares with its rank are counted once, in the rank's RSS). Measured 380-420 MiB anonymous.
WORKER_BASE_BYTES = 520 * MIB
# A worker holds the pickled split and the array made from it while it starts.
WORKER_DATA_COPIES = 2

# ---- CUDA: not measured -----------------------------------------------------------------------
#
# The test machine has no GPU, so these are conservative figures, not measurements: a CUDA
# context with cuBLAS / cuDNN loaded commonly costs 1-2 GiB of host memory (the driver's and the
# libraries' host allocations) and 300-600 MiB on the device; the caching allocator's rounding
# and cuDNN's benchmark workspaces are the margin on the device figures.

CUDA_CONTEXT_HOST_BYTES = 2 * GIB
CUDA_CONTEXT_DEVICE_BYTES = 614 * MIB
DEVICE_MARGIN = 1.25

# Trainable parameters without the classifier head, and the head's input features (torchvision's
# resnet18/34/50 and engine.train.models.SmallCNN at width 16).
_BACKBONES = {
    "small_cnn": (23_696, 64),
    "resnet18": (11_176_512, 512),
    "resnet34": (21_284_672, 512),
    "resnet50": (23_508_032, 2048),
}


def parameter_count(model: ModelConfig) -> int:
    """Trainable parameters of the configured model, head included (10 or 1,000 classes)."""
    backbone, features = _BACKBONES[model.name]
    classes = 1000 if model.imagenet_head else 10
    return backbone + features * classes + classes


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated peak memory of one run, in bytes. ``host_bytes`` is the whole run on this node."""

    launcher_host_bytes: int
    rank_host_bytes: int  # one rank process
    workers_host_bytes: int  # all DataLoader workers of one rank, together
    ranks: int  # rank processes on this node
    device_bytes_per_gpu: int  # 0 for a CPU run

    @property
    def host_bytes(self) -> int:
        return self.launcher_host_bytes + self.ranks * (
            self.rank_host_bytes + self.workers_host_bytes
        )


def _data_images(config: RunConfig) -> int:
    return config.data.train_size + config.data.test_size


def rank_host_bytes(plan: RunPlan) -> int:
    """One rank process's peak host memory (DataLoader workers not included)."""
    config = plan.config
    data = int(
        _data_images(config)
        * IMAGE_BYTES
        * DATA_COPIES[(config.data.dataset, config.data.pipeline)]
    )
    data += config.data.train_size * SAMPLER_BYTES_PER_IMAGE
    model_bytes = parameter_count(config.model) * PARAMETER_BYTES
    if plan.devices.kind == "cuda":
        # The model is built on the host, then moved; training happens on the device.
        return RANK_BASE_BYTES + CUDA_CONTEXT_HOST_BYTES + model_bytes + data
    activations = config.training.batch_size * ACTIVATION_BYTES_PER_IMAGE[config.model.name]
    return RANK_BASE_BYTES + model_bytes * MODEL_STATE_COPIES + activations + data


def workers_host_bytes(config: RunConfig) -> int:
    """All DataLoader workers of one rank at once: the training ones and the evaluation ones."""
    if config.data.pipeline != "torchvision" or config.data.num_workers == 0:
        return 0
    workers = config.data.num_workers
    splits = (config.data.train_size, config.data.test_size if config.training.evaluate else None)
    total = 0
    for images in splits:
        if images is not None:
            total += workers * (WORKER_BASE_BYTES + images * PIXEL_BYTES * WORKER_DATA_COPIES)
    return total


def device_bytes_per_gpu(plan: RunPlan) -> int:
    """Peak memory of the busiest GPU of a CUDA run (0 for a CPU run).

    DataParallel splits the batch across its GPUs but gathers gradients, and the tensor pipeline's
    data, on the first; every GPU is counted as that first one.
    """
    if plan.devices.kind != "cuda":
        return 0
    config = plan.config
    batch = config.training.batch_size
    if config.strategy.name == "dataparallel":
        batch = -(-batch // plan.device_count)
    test_share = config.data.test_size if config.strategy.name != "ddp" else None
    if test_share is None:
        test_share = -(-config.data.test_size // plan.world_size)
    data = 0
    if config.data.pipeline == "tensor":
        data = (config.data.train_size + test_share) * IMAGE_BYTES
    state = parameter_count(config.model) * PARAMETER_BYTES * MODEL_STATE_COPIES
    activations = batch * ACTIVATION_BYTES_PER_IMAGE[config.model.name]
    return CUDA_CONTEXT_DEVICE_BYTES + int((state + activations + data) * DEVICE_MARGIN)


def estimate_memory(plan: RunPlan) -> MemoryEstimate:
    """The estimated peak memory of ``plan``'s processes on this node."""
    return MemoryEstimate(
        launcher_host_bytes=LAUNCHER_BYTES,
        rank_host_bytes=rank_host_bytes(plan),
        workers_host_bytes=workers_host_bytes(plan.config),
        ranks=plan.world_size,
        device_bytes_per_gpu=device_bytes_per_gpu(plan),
    )
