"""The network edge the exporter and the restarter share, so neither imports the other.

- `fetch.py`: every request to a model server: read `/metrics`, ask `/v1/models`, the engine's
  own sleep and fault checks, the idle test request; no redirect followed.
- `offload.py`: the small thread pool that parses and judges a big payload off the event loop.
- `gate.py`: the cap on incoming connections and the header-read deadline in front of an app.
"""
