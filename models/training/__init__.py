"""Training: the loop, early stopping and the batches it draws."""
