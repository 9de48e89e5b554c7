"""The distillation loop (``laneway distill``): production traffic and its
quality signals in, a learned router out.

- ``export``: one row per answered model request of a time window, joined
  from the request, result, quality and feedback topics (``export.py``,
  rows in ``rows.py``).
- ``train``: a RouteLLM-style learned router, fitted with scikit-learn and
  saved as a plain-JSON artifact (``train.py``, ``labels.py``).
- ``report``: the learned router against today's feature rule on held-out
  rows, with the quality/cost curve (``report.py``).
- the artifact and its numpy scoring live in ``streams.routing.learned``,
  shared with the classifier and the roll-out (no scikit-learn at serve
  time): the classifier never imports this package.

Nothing is imported here.
"""
