"""What people run: the CLI, the demo, benchmarks, the supervisor and the
embedded broker and Redis.
"""
