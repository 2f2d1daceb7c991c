"""Where the built-in dashboard's numbers come from, one module per source:

- :mod:`dashboard.sources.metrics`: the learner's JSONL metrics log (:class:`JsonlLog`), the
  services' scraped Prometheus ``/metrics`` (:class:`Scraper`), and :func:`chart_data`, which turns
  a chart's series into the lines the page draws;
- :mod:`dashboard.sources.samples`: the samples page's rows (:class:`SampleFilter`,
  :func:`sample_rows`) from the Redis trajectory stream (:class:`SampleReader`), and the
  allocation charts drawn from groups;
- :mod:`dashboard.sources.run_folder`: what a run leaves in its folder (:class:`RunFolder`): the
  recorded metric histories, the sample logs and ``up``'s evaluations, for a run that has ended.
"""

from dashboard.sources.metrics import JsonlLog, Scraper, Snapshot, chart_data, parse_exposition
from dashboard.sources.run_folder import RunFolder
from dashboard.sources.samples import SampleFilter, SampleReader, allocation_charts, sample_rows

__all__ = [
    "JsonlLog",
    "RunFolder",
    "SampleFilter",
    "SampleReader",
    "Scraper",
    "Snapshot",
    "allocation_charts",
    "chart_data",
    "parse_exposition",
    "sample_rows",
]
