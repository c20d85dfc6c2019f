"""GPQA-Diamond evaluation of an OpenAI-compatible endpoint: crash-safe, statistically honest.

Public surface: ``extract_answer`` (layered answer extraction) and ``run_gpqa`` /
``rescore_log`` (what ``tandem eval gpqa`` and ``tandem eval rescore`` call).
"""

from tandem.eval.extract import extract_answer

__all__ = ["extract_answer"]
