"""Environment variables known to break or slow a deployment, as a data table.

Each entry says which variable (and, optionally, which values) is bad, how bad, what happens,
and the fix, with the source where it was seen. ``tandem.check.rules.software.KnownBadEnvRule``
reads this table against every rank's environment; adding a lesson means adding a row.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.check.findings import Severity


@dataclass(frozen=True)
class BadEnv:
    """One known-bad variable.

    ``values``: the values that are bad (compared case-insensitively); ``None`` means any value,
    and ``("",)`` an empty one. ``only_with_ib``: bad only when the data plane is RoCE/IB.
    ``severity_by_vllm``: a different severity on these vLLM versions.
    """

    name: str
    severity: Severity
    effect: str
    fix: str
    source: str
    values: tuple[str, ...] | None = None
    only_with_ib: bool = False
    severity_by_vllm: tuple[tuple[str, Severity], ...] = ()

    def matches(self, value: str) -> bool:
        return self.values is None or value.strip().lower() in {v.lower() for v in self.values}

    def severity_for(self, vllm_version: str | None) -> Severity:
        return dict(self.severity_by_vllm).get(vllm_version or "", self.severity)


_B12X_CRASH = (
    "crashes vLLM's import (`cannot import b12x_mhc_pre`): the image's b12x package "
    "does not have that kernel"
)
_B12X_FIX = "remove it; of the b12x flags set only VLLM_USE_B12X_MOE=1"
_SEED000 = "seed 000, 'The minor ones'"

KNOWN_BAD_ENV: tuple[BadEnv, ...] = (
    BadEnv("VLLM_USE_B12X_MHC", Severity.ERROR, _B12X_CRASH, _B12X_FIX, _SEED000),
    BadEnv("VLLM_USE_B12X_FP8_GEMM", Severity.ERROR, _B12X_CRASH, _B12X_FIX, _SEED000),
    BadEnv(
        "VLLM_USE_B12X_WO_PROJECTION",
        Severity.ERROR,
        _B12X_CRASH,
        _B12X_FIX,
        _SEED000,
        severity_by_vllm=(("0.25.1", Severity.WARNING),),
    ),
    BadEnv(
        "VLLM_PORT",
        Severity.ERROR,
        "vLLM uses VLLM_PORT for its own internal sockets; a Kubernetes Service named `vllm` "
        "injects VLLM_PORT=tcp://... and breaks start-up",
        "remove it; the API port is ports.api (and never name a Service `vllm`)",
        "vLLM docs, environment variables",
    ),
    BadEnv(
        "NCCL_IB_DISABLE",
        Severity.ERROR,
        "turns RoCE/IB off, so NCCL falls back to TCP "
        "sockets (NET/Socket): about half the decode speed",
        "remove it or set it to 0",
        "hcflabs k3s chart README",
        values=("1",),
        only_with_ib=True,
    ),
    BadEnv(
        "NCCL_NET",
        Severity.ERROR,
        "forces NCCL's TCP transport on a RoCE data plane",
        "remove it (tandem sets NCCL_NET=IB for transport: ib)",
        "NCCL docs",
        values=("socket",),
        only_with_ib=True,
    ),
    BadEnv(
        "NCCL_P2P_DISABLE",
        Severity.WARNING,
        "stops NVLink/PCIe peer-to-peer between GPUs "
        "of one node; intra-node traffic goes through host memory",
        "remove it",
        "NCCL docs",
        values=("1",),
    ),
    *(  # the two lines of one stale /etc/nccl.conf, found together
        BadEnv(
            name,
            Severity.WARNING,
            "froze the 4-byte PyNccl warm-up all-reduce of a 3-Spark RoCE ring",
            "set it to 0 or remove it",
            "luxingcom/aicad-nccl-optimization #1 (a stale /etc/nccl.conf in the image)",
            values=("1",),
            only_with_ib=True,
        )
        for name in ("NCCL_IB_USE_INLINE", "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS")
    ),
)
"""Every known-bad variable; rules report the first matching row per variable."""


def known_bad(name: str, value: str, *, uses_ib: bool) -> BadEnv | None:
    """The first row of ``KNOWN_BAD_ENV`` that ``name=value`` matches on this data plane."""
    return next(
        (
            row
            for row in KNOWN_BAD_ENV
            if row.name == name and row.matches(value) and (uses_ib or not row.only_with_ib)
        ),
        None,
    )


EMPTY_NCCL_VARIABLE = BadEnv(
    "NCCL_*",
    Severity.WARNING,
    "an empty NCCL variable still counts as set and masks the value in /etc/nccl.conf",
    "remove the variable instead of leaving it empty",
    "MiaAI-Lab compose entrypoint (unsets empty NCCL knobs before exec)",
    values=("",),
)
