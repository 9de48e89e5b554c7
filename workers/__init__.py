"""Lane workers, the dynamic batcher and the model backends."""
