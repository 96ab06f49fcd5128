"""Batch reindexing into metric-native FAISS indexes, versioned on disk."""
