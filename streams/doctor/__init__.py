"""``laneway doctor``: the source article's diagnosis flow for a slow stack.

``readings`` (what is read, plain data), ``gather`` (reading it from a live
stack), ``diagnose`` (the findings: pure functions), ``cli`` (the command).
"""
