"""The classifier: its request loop (a plain aiokafka intake in a faust
app), the pure decision (the lane decided once: ``lanes``), the smart
router, flow control, the realtime gate and drift. What the decision is
made of and other rooms share (features, the model registry, path
statistics, the learned router) is ``streams.routing``.
"""
