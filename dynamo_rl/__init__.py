"""DynaMO-RL shared package: what more than one process imports (config schemas, wire contracts,
Redis key names, the trajectory codec, metrics and process helpers, environments) and the
``dynamo-rl`` command line's name table. The launcher, the dashboard and the task generators are
applications on top of it, in their own top-level packages; nothing here imports them.

Importing it never imports torch or transformers (checked by a test and an import-linter contract),
so every service and ``dynamo-rl --help`` start fast.
"""

__version__ = "0.1.0"
