"""PVSE (Song & Soleymani): K point embeddings per item, matched by their best pair."""
