"""What an operator watches: the Prometheus figures at /metrics, the
liveness and readiness probes (/livez, /readyz), and logs that carry a
request id (and a job's ids where they are known) in JSON.

``fleet`` is the one module here that reads the runners' tables."""
