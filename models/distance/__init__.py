"""The Gaussian distance math: closed forms, and the augmented vectors FAISS searches."""
