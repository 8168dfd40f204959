"""What more than one test tier uses: the exporter and the restarter run in-process, the alerting
stack and the pipeline around them, the fake Kubernetes API, the captured real payloads and the
real servers' environments. A tier's own helpers stay in the tier."""
