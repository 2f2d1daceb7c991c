"""DynaMO-RL shared package: config schemas, Redis key names, the trajectory codec, metrics helpers,
process helpers and the ``dynamo-rl`` command line.

Importing it never imports torch or transformers (checked by a test and an import-linter contract),
so every service and ``dynamo-rl --help`` start fast.
"""

__version__ = "0.1.0"
