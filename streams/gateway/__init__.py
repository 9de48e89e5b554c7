"""The OpenAI-compatible HTTP gateway (``laneway gateway``): HTTP in front
of the request topic. See docs/gateway.md.

- ``translate``: an OpenAI request body <-> a laneway request and result (pure)
- ``errors``: laneway's error codes -> HTTP status and OpenAI error objects (pure)
- ``keys``: API keys, kept hashed in a file, each a tenant with limits
- ``limiter``: requests and tokens per minute per key (pure)
- ``sse``: what a streamed answer sends, restarts included (pure)
- ``app``: the aiohttp routes
- ``server``: the process (``laneway gateway``)
- ``cli``: ``laneway gateway`` and ``laneway keys``
"""
