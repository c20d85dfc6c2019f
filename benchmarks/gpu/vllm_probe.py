"""A vLLM general plugin that measures, from inside the engine core, what vLLM's own profile run
and CUDA-graph estimate allocate (vLLM 0.25.1, V1 model runner ``gpu_model_runner.py``).

Loaded by vLLM in every process (``vllm.general_plugins`` entry point; ``install`` writes the
dist-info that declares it) and active only when ``TANDEM_PROBE_DIR`` is set. It changes no
figure vLLM computes: it only reads torch's counters, which vLLM reads too.

- ``profile_run`` (V1 and V2 runner): torch's allocated bytes before, the running peak after
  the forward and after the sampler (``PROBE`` lines in the log); on eager boots also torch's
  memory history during the run (``profile_run-<pid>.pickle``: every block with its Python
  stack), from which ``profile_peak.py`` names the tensors live at the peak.
- ``_warmup_and_capture`` (the captures ``profile_cudagraph_memory`` measures): free device
  memory, torch's reserved and allocated bytes before and after each of the first captures.

    python3 benchmarks/gpu/vllm_probe.py /root/probe   # then PYTHONPATH=/root/probe:...
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

GIB = 1024**3


def _line(text: str) -> None:
    print(f"PROBE {text}", file=sys.stderr, flush=True)


def register() -> None:
    """vLLM's plugin hook: wrap the runner's methods once, when the probe is asked for."""
    folder = os.environ.get("TANDEM_PROBE_DIR")
    if not folder:
        return
    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.gpu import model_runner

    _wrap(gpu_model_runner.GPUModelRunner, folder)
    _wrap(model_runner.GPUModelRunner, folder)


def _wrap(runner, folder: str) -> None:
    """Wrap one runner class (V1 ``gpu_model_runner`` or V2 ``gpu/model_runner``) once."""
    import torch

    if getattr(runner, "_tandem_probe", False):
        return
    runner._tandem_probe = True
    profile_run, sampler_run = runner.profile_run, runner._dummy_sampler_run
    warmup_and_capture = getattr(runner, "_warmup_and_capture", None)
    captures = {"n": 0}

    def probed_profile_run(self) -> None:
        record = bool(self.vllm_config.model_config.enforce_eager)
        if record:
            torch.cuda.memory._record_memory_history(max_entries=400_000, stacks="python")
        base = torch.cuda.memory_allocated()
        _line(f"profile_run start allocated={base} peak={torch.cuda.max_memory_allocated()}")
        profile_run(self)
        _line(
            f"profile_run end allocated={torch.cuda.memory_allocated()} "
            f"peak={torch.cuda.max_memory_allocated()} peak_increase="
            f"{(torch.cuda.max_memory_allocated() - base) / GIB:.4f}GiB"
        )
        if record:
            path = Path(folder) / f"profile_run-{os.getpid()}.pickle"
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)

    def probed_sampler_run(self, hidden_states):
        _line(
            f"sampler start allocated={torch.cuda.memory_allocated()} "
            f"peak={torch.cuda.max_memory_allocated()} rows={hidden_states.shape[0]}"
        )
        out = sampler_run(self, hidden_states)
        _line(
            f"sampler end allocated={torch.cuda.memory_allocated()} "
            f"peak={torch.cuda.max_memory_allocated()}"
        )
        return out

    def probed_warmup_and_capture(self, desc, cudagraph_runtime_mode, *args, **kwargs):
        captures["n"] += 1
        if captures["n"] > 8:
            return warmup_and_capture(self, desc, cudagraph_runtime_mode, *args, **kwargs)
        free0 = torch.cuda.mem_get_info()[0]
        res0, alloc0 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
        out = warmup_and_capture(self, desc, cudagraph_runtime_mode, *args, **kwargs)
        torch.cuda.synchronize()
        free1 = torch.cuda.mem_get_info()[0]
        res1, alloc1 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
        _line(
            f"capture {captures['n']} mode={cudagraph_runtime_mode.name} "
            f"tokens={desc.num_tokens} uniform={desc.uniform} "
            f"device_used={(free0 - free1) / 2**20:.1f}MiB "
            f"torch_reserved={(res1 - res0) / 2**20:.1f}MiB "
            f"torch_allocated={(alloc1 - alloc0) / 2**20:.1f}MiB "
            f"kwargs={sorted(kwargs)}"
        )
        return out

    runner.profile_run = probed_profile_run
    runner._dummy_sampler_run = probed_sampler_run
    if warmup_and_capture is not None:
        runner._warmup_and_capture = probed_warmup_and_capture


def install(dest: Path) -> None:
    """Copy this module to ``dest`` with a dist-info declaring it a vLLM general plugin."""
    info = dest / "tandem_probe-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    shutil.copy(__file__, dest / "tandem_probe.py")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tandem-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\ntandem_probe = tandem_probe:register\n"
    )


if __name__ == "__main__":
    install(Path(sys.argv[1]))
