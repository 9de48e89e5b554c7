"""The faust app, topic registry, classifier, client SDK, embedded stack and CLI."""
