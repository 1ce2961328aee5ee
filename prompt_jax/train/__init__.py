"""Training: trainable/frozen split, jitted step, optimizers, data, checkpoints, the loop."""
