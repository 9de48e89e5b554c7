"""The classifier: its faust app, the pure decision, features, the smart
router, the model registry, flow control and drift.
"""
