"""Real Prometheus and Alertmanager on loopback, running stallwatch's own rules and routing.

Used by `stallwatch demo` and by the end-to-end tests' harness. It starts the binaries of
Debian's `prometheus` and `prometheus-alertmanager` packages (Prometheus >= 2.42, Alertmanager
>= 0.25) on free loopback ports, with temporary storage and clustering off.

- `rewrite`: the project's files and their rewrite, which changes only timing and addresses,
  never logic (pure);
- `processes`: subprocesses in their own process groups, free ports, waiting until ready;
- `stack`: `LocalStack`, the two processes with the rewritten configs, and their query APIs;
- `errors`: `LocalStackError` and its kinds.

What the rewrite changes:

- prometheus/prometheus.yml: scrape and evaluation interval (default 1 s; the scrape timeout
  equals the interval), the `prometheus`, `stallwatch-exporter` and `stallwatch-restarter` jobs
  and the Alertmanager pointed at loopback ports, the rule files at the rewritten copies.
- prometheus/alerts.yml and recording.yml: only the `for:` durations of the alerts named in
  `Timings.alert_for` (by default LLMServerDown 10m -> 3s, StallwatchExporterDown 1m -> 2s). The
  restart alerts have no `for:`: they count exporter polls.
- alertmanager/alertmanager.yml: `group_wait` and `group_interval` (default 0s and 1s) on the
  root route and on every route that sets them; the restarter webhook's URL and token file.

Usage::

    with LocalStack(workdir, scrape=ScrapeTargets(exporter="127.0.0.1:9732",
                                                  restarter="127.0.0.1:9733"),
                    webhook=Webhook(url="http://127.0.0.1:9733/alerts", token=token)) as stack:
        stack.query('stallwatch_target_state{state="stalled"} == 1')
        stack.alerts()
"""
