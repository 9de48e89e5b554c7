"""The classifier: its request loop (a plain aiokafka intake in a faust
app), the pure decision, features, the smart router, the model registry,
flow control and drift.
"""
