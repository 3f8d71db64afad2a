"""Fine-tuning: the training loop, the fit of one node and the length rule."""
