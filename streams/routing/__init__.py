"""What routing decisions are made of, shared by the rooms that make,
judge or roll them out (classify, quality, distill, rollout, the workers,
the session store): the request features, the model registry, each path's
live statistics and the learned router. It imports nothing of ours but
``schemas``.
"""
