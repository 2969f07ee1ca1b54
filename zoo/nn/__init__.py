"""Building blocks shared by several papers."""

from zoo.nn.kmeans import kmeans_centroids
from zoo.nn.sinkhorn import sinkhorn

__all__ = ["kmeans_centroids", "sinkhorn"]
