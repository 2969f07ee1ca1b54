"""Building blocks shared by several papers."""

from zoo.nn.kmeans import kmeans_centroids

__all__ = ["kmeans_centroids"]
