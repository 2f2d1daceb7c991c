"""The launcher: what starts the services on one machine, not a service itself.

- :mod:`launcher.up`: ``dynamo-rl up``, the whole recipe (task data, a tiny model, the warm start,
  the services, evaluations before and after, training) on a supervisor;
- :mod:`launcher.warm_start`: ``up``'s supervised warm start, its recipes and its one loop;
- :mod:`launcher.stage`: ``dynamo-rl stage``, one stage of that recipe on its own (compose);
- :mod:`launcher.supervisor`: start, wait for health, restart with back-off, stop everything;
- :mod:`launcher.service_table`: each service's command line, health probe and ports, the one
  table every launcher (``up``, ``eval``'s self-contained mode, the benchmarks, the tests) starts
  services through.

It starts the services as processes and imports none of them (an import-linter contract).
"""
