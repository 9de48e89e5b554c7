"""The response cache: exact and semantic look-ups, its keys, the embedder,
hot-question counts and the nightly pre-warm.
"""
