"""Redis-backed stores shared by the classifier and the workers: sessions, rate
limits, the lane backlog board, and the one fail-open rule they all follow.
"""
