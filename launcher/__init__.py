"""The launcher: what starts the services on one machine, not a service itself.

- :mod:`launcher.up`: ``dynamo-rl up``, the whole recipe (task data, a tiny model, the warm start,
  the services, evaluations before and after, training) on a supervisor;
- :mod:`launcher.warm_start`: ``up``'s supervised warm start, its recipes and its one loop;
- :mod:`launcher.stage`: ``dynamo-rl stage``, one stage of that recipe on its own (compose);
- :mod:`launcher.supervisor`: start, wait for health, restart with back-off, stop everything.

Every service is started through the one table of their command lines, health probes and ports,
:mod:`dynamo_rl.service_table` (in the shared package, so ``eval``'s self-contained mode, the
benchmarks and the tests use it without the launcher). The launcher starts the services as
processes and imports none of them, and no service imports the launcher (import-linter contracts).
"""
