"""Device sets: parse ``--devices`` and resolve it against this machine, before anything starts.

Plain Python: GPU counts come from NVML (``engine.core.host.gpus``), never from CUDA, so the UI can call this.
GPU indices are NVML / PCI bus order; the launcher sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that
CUDA's index i is the same card.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.common.config_error import ConfigError

DEFAULT_CPU_DDP_RANKS = 2
SPEC_KEY = "devices.spec"


@dataclass(frozen=True)
class DeviceSpec:
    """What the user asked for. ``kind`` is auto | all | count | gpus | cpu."""

    kind: str
    count: int = 0
    gpu_indices: tuple[int, ...] = ()


@dataclass(frozen=True)
class DevicePlan:
    """What a run will use: CPU ranks, or a set of GPUs (NVML indices)."""

    kind: str  # "cpu" | "cuda"
    gpu_indices: tuple[int, ...] = ()
    cpu_ranks: int = 0

    @property
    def device_count(self) -> int:
        return len(self.gpu_indices) if self.kind == "cuda" else self.cpu_ranks

    def describe(self) -> str:
        """``cpu:N`` or ``gpu:I,J``: what run.json and summary.json record as ``devices``;
        ``from_description`` reads it back."""
        if self.kind == "cpu":
            return f"cpu:{self.cpu_ranks}"
        return "gpu:" + ",".join(str(i) for i in self.gpu_indices)

    @classmethod
    def from_description(cls, text: str) -> DevicePlan | None:
        """The plan ``describe()`` wrote, read back through ``parse_device_spec``; None for any
        other text (a spec not yet resolved against a machine, such as ``auto`` or ``2``, or a
        damaged one): a reader of a run's files guesses nothing."""
        if not text.startswith(("cpu", "gpu:")):
            return None
        try:
            spec = parse_device_spec(text)
        except ConfigError:
            return None
        if spec.kind == "cpu":
            return cls(kind="cpu", cpu_ranks=spec.count)
        return cls(kind="cuda", gpu_indices=spec.gpu_indices)


def parse_device_spec(spec: str) -> DeviceSpec:
    """Parse auto | all | N | 0,2 | gpu:1 | cpu | cpu:N; a malformed spec is a ConfigError.

    A lone number is a count ("2": the first two GPUs); ``gpu:LIST`` always names indices, so
    ``gpu:1`` is GPU 1 alone, and ``DevicePlan.describe()`` reads back as the same set.
    """
    text = spec.strip().lower()
    bad = ConfigError(
        f"devices.spec is {spec!r}; expected auto, all, a count (2), GPU indices (0,2 or gpu:1), cpu or cpu:N",
        key=SPEC_KEY,
        reason=f"devices.spec {spec!r} is not a device set",
    )
    if text in ("auto", "all"):
        return DeviceSpec(kind=text)
    if text == "cpu":
        return DeviceSpec(kind="cpu", count=1)
    if text.startswith("cpu:"):
        count = text[4:]
        if not count.isdigit() or int(count) < 1:
            raise bad
        return DeviceSpec(kind="cpu", count=int(count))
    if text.isdigit():
        if int(text) < 1:
            raise bad
        return DeviceSpec(kind="count", count=int(text))
    parts = [p.strip() for p in text.removeprefix("gpu:").split(",")]
    if parts and all(p.isdigit() for p in parts):
        indices = tuple(int(p) for p in parts)
        if len(set(indices)) != len(indices):
            raise ConfigError(
                f"devices.spec {spec!r} names a GPU twice", key=SPEC_KEY, reason="a GPU named twice"
            )
        return DeviceSpec(kind="gpus", gpu_indices=indices)
    raise bad


def resolve_devices(spec_text: str, strategy: str, gpu_count: int) -> DevicePlan:
    """Turn a spec into the devices a run of ``strategy`` will use on a machine with ``gpu_count`` GPUs.

    Raises ConfigError with the reason when the spec cannot be met here.
    """
    spec = parse_device_spec(spec_text)
    if spec.kind == "cpu":
        return DevicePlan(kind="cpu", cpu_ranks=spec.count)
    if spec.kind == "auto":
        if gpu_count == 0:
            ranks = DEFAULT_CPU_DDP_RANKS if strategy == "ddp" else 1
            return DevicePlan(kind="cpu", cpu_ranks=ranks)
        wanted = 1 if strategy == "single" else gpu_count
        return DevicePlan(kind="cuda", gpu_indices=tuple(range(wanted)))
    if gpu_count == 0:
        raise ConfigError(
            f"devices.spec {spec_text!r} asks for GPUs, but this machine has none visible to NVML; "
            "use cpu or cpu:N",
            key=SPEC_KEY,
            reason="needs a GPU, none here",
        )
    if spec.kind == "all":
        return DevicePlan(kind="cuda", gpu_indices=tuple(range(gpu_count)))
    if spec.kind == "count":
        if spec.count > gpu_count:
            raise ConfigError(
                f"devices.spec {spec_text!r} asks for {spec.count} GPUs, but this machine has {gpu_count}",
                key=SPEC_KEY,
                reason=f"needs {spec.count} GPUs, {gpu_count} here",
            )
        return DevicePlan(kind="cuda", gpu_indices=tuple(range(spec.count)))
    missing = [i for i in spec.gpu_indices if i >= gpu_count]
    if missing:
        raise ConfigError(
            f"devices.spec {spec_text!r} names GPU {missing[0]}, but this machine has GPUs "
            f"0 to {gpu_count - 1}"
            if gpu_count > 1
            else f"devices.spec {spec_text!r} names GPU {missing[0]}, but this machine has only GPU 0",
            key=SPEC_KEY,
            reason=f"no GPU {missing[0]} here",
        )
    return DevicePlan(kind="cuda", gpu_indices=spec.gpu_indices)
