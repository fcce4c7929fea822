"""What the arms and the cluster say: logs, /metrics, pool pressure, Kubernetes objects, read into records."""
