"""Does the served model answer right: GPQA-Diamond over hours, and the smoke checks in a minute.

GPQA (``runner``) is crash-safe and statistically honest; the smoke checks (``smoke``, with the
tool-call judge in ``toolschema``) are what people run by hand right after a boot or an upgrade.

Public surface:
- ``extract_answer(text) -> (letter | None, rule)``: the layered answer extraction;
- ``run_gpqa(GPQAConfig)`` and ``rescore_log(path)``: what ``tandem eval gpqa`` and
  ``tandem eval rescore`` call; both return an ``EvalReport`` (the ``report.json`` model).
"""

from tandem.eval.extract import extract_answer
from tandem.eval.report import EvalReport
from tandem.eval.runner import GPQAConfig, rescore_log, run_gpqa

__all__ = ["EvalReport", "GPQAConfig", "extract_answer", "rescore_log", "run_gpqa"]
