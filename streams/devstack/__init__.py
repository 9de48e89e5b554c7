"""The dev stack: the supervisor of `laneway up`, the embedded broker and
Valkey, the logs, the demo and the current-stack file."""
