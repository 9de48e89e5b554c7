"""The distillation loop (``laneway distill``): production traffic and its
quality signals in, a learned router out.

- ``export``: one row per answered model request of a time window, joined
  from the request, result, quality and feedback topics (``export.py``,
  rows in ``rows.py``).
- ``train``: a RouteLLM-style learned router, fitted with scikit-learn and
  saved as a plain-JSON artifact (``train.py``, ``labels.py``).
- ``report``: the learned router against today's feature rule on held-out
  rows, with the quality/cost curve (``report.py``).
- ``learned.py``: the artifact and its numpy scoring, the only part the
  classifier imports (no scikit-learn at serve time).

Nothing is imported here: the classifier loads ``streams.distill.learned``
alone.
"""
