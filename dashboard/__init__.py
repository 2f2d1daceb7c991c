"""The built-in dashboard: ``dynamo-rl dashboard``, for runs without Prometheus and Grafana.

A small HTTP server (standard library only, no torch) with two pages:

- ``/``: the core charts of a run (training, allocation, throughput, health), refreshed live. The
  numbers come from two places: the learner's JSONL metrics log in the run folder (the full
  per-step history, even when the dashboard starts late) and the services' Prometheus ``/metrics``
  endpoints, which the server scrapes on an interval and keeps a window of.
- ``/samples``: recent trajectory groups read from the Redis trajectory stream with
  :mod:`dynamo_rl.codec` (prompt, response, reward and the verifier's reason, the allocator's
  count, a group-normalised advantage) for reviewing reward hacking by eye, filterable by reward
  and data source.

Which metric each chart shows is data (:mod:`dashboard.charts`); a test checks every
metric name there against the services' metric registries, as it does for the Grafana dashboard.
The charts are drawn by a few hundred lines of our own JavaScript into inline SVG: no CDN, no
build step, nothing fetched from outside the server.
"""
