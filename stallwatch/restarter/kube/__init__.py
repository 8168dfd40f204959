"""The restarter on Kubernetes: pods as targets, restarts through the API, one acting replica."""
