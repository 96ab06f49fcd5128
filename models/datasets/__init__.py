"""Built-in and user datasets of image-caption pairs."""
