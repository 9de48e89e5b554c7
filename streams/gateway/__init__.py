"""The OpenAI-compatible HTTP gateway (``laneway gateway``): HTTP in front
of the request topic. See docs/gateway.md.

- ``translate``: an OpenAI request body <-> a laneway request and result (pure)
- ``errors``: laneway's error codes -> HTTP status and OpenAI error objects (pure)
- ``keys``: API keys, kept hashed in a file, each a tenant with limits
- ``limiter``: requests and tokens per minute per key (pure; the fallback)
- ``shared_limits``: the same, counted in Redis so replicas share one budget
- ``sse``: what a streamed answer sends, restarts included (pure)
- ``feedback``: ``POST /v1/feedback`` bodies -> ``Feedback`` (pure)
- ``bodies``: a request's JSON body, or a 400
- ``files``: uploaded batch files in Redis, checked whole on upload
- ``batch_shapes``: the Batch API's objects from laneway's jobs (pure)
- ``batch_store``: the gateway's batch records and submission leases in Redis
- ``submitter``: batch submission in the background, resumed after a restart
- ``batches``: the Files and Batch API routes
- ``app``: the aiohttp routes
- ``server``: the process (``laneway gateway``)
- ``cli``: ``laneway gateway`` and ``laneway keys``
"""
