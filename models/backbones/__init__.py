"""Frozen pretrained backbones: an image or a caption in, one feature vector out. The
probabilistic heads that map these vectors to Gaussians are trained on top of them."""
