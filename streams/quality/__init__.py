"""The quality loop (``laneway router``): path statistics from quality events,
published for the router.
"""
